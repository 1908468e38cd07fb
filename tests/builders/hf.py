"""Hugging Face datasets (converters/hf.py) of the solid pictures, built with the `datasets` library itself:
in memory, saved to disk (a Dataset and a DatasetDict), as a Hub-style folder of Parquet files and in a
`datasets` cache."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .images import Tree, solid_id_of_path, solid_label
from .sources import multi_labels, solid_metadata

# ClassLabel names, in the dataset's own (unsorted) order: a conversion must keep it, and the ids with it.
HF_CLASSES = ("moth", "ant", "zebra")
HF_METADATA = ["tags", "id", "name", "score", "odd", "note"]  # kept as metadata: JSON scalars and lists of them


def hf_row_ids(count: int) -> list[int]:
    """The solid sample id of each row of the HF test datasets: a fixed shuffle, so that row order is not the
    tree's order."""
    return [int(i) for i in np.random.default_rng(11).permutation(count)]


def hf_features(image: bool = True):
    from datasets import ClassLabel, Features, Image, Sequence, Value

    columns = {"image": Image()} if image else {"text": Value("string")}
    return Features({**columns, "label": ClassLabel(names=list(HF_CLASSES)),
                     "tags": Sequence(ClassLabel(names=list(HF_CLASSES))), "id": Value("int64"),
                     "name": Value("string"), "score": Value("float64"), "odd": Value("bool"),
                     "note": Value("string")})


def hf_dataset(tree: Tree, broken: dict[int, bytes | None] | None = None, paths: bool = False):
    """The solid `tree` as a `datasets.Dataset`: row r is solid sample `hf_row_ids(...)[r]`: its file's bytes in
    the Image column (`paths`: only its path, relative to the tree's root), its class (`solid_label`) as label, its
    `multi_labels` as tags and its `solid_metadata` columns. `broken` maps rows to other image bytes (None: a null
    image)."""
    from datasets import Dataset

    ids = hf_row_ids(len(tree.images))
    by_id = {solid_id_of_path(relative): relative for relative in tree.images}
    images = []
    for row, sample_id in enumerate(ids):
        relative = by_id[sample_id]
        if broken is not None and row in broken:
            images.append(None if broken[row] is None else {"bytes": broken[row], "path": None})
        elif paths:
            images.append({"bytes": None, "path": relative})
        else:
            images.append({"bytes": tree.path(relative).read_bytes(), "path": Path(relative).name})
    metadata = [solid_metadata(i) for i in ids]
    return Dataset.from_dict({"image": images, "label": [solid_label(i) for i in ids],
                              "tags": [list(multi_labels(i)) for i in ids],
                              **{name: [m[name] for m in metadata] for name in HF_METADATA if name != "tags"}},
                             features=hf_features())


@dataclass
class HfSources:
    """The solid tree as each kind of Hugging Face source (`write_hf_sources`)."""

    saved: Path  # save_to_disk of a Dataset, in 3 Arrow files
    saved_dict: Path  # save_to_disk of a DatasetDict: "train" (the first 4 rows) and "test" (all rows)
    parquet: Path  # a Hub-style folder: data/train-0000{0,1}-of-00002.parquet, row groups of 5 rows
    cache: Path  # a Hugging Face datasets cache holding the Hub dataset HUB_NAME (train: all rows)


HUB_NAME = "fastdata-tests/solid"


def write_hub_cache(cache: Path, name: str, data_files: dict[str, list[str]]) -> Path:
    """Place the Hub dataset `name` in the datasets cache `cache` as `datasets.load_dataset(name)` leaves it there
    (prepared by datasets' own Parquet builder from `data_files`), without the network."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    namespace, _, dataset = name.rpartition("/")
    builder = Parquet(cache_dir=str(cache / ".scratch"), dataset_name=dataset, data_files=data_files)
    builder.download_and_prepare(output_dir=str(cache / f"{namespace}___{dataset}" / "default" / "0.0.0" / "f00d"))
    shutil.rmtree(cache / ".scratch", ignore_errors=True)
    return cache


def write_hf_sources(tree: Tree, root: Path) -> HfSources:
    from datasets import DatasetDict

    ds = hf_dataset(tree)
    ds.save_to_disk(str(root / "saved"), num_shards=3)
    DatasetDict({"train": ds.select(range(4)), "test": ds}).save_to_disk(str(root / "dict"))
    (root / "hub" / "data").mkdir(parents=True)
    parts = [str(root / "hub" / "data" / f"train-0000{i}-of-00002.parquet") for i in range(2)]
    for i, part in enumerate(parts):
        ds.shard(2, i, contiguous=True).to_parquet(part, batch_size=5)
    (root / "hub" / "README.md").write_text("---\nlicense: mit\n---\n")
    write_hub_cache(root / "cache", HUB_NAME, {"train": parts})
    return HfSources(root / "saved", root / "dict", root / "hub", root / "cache")
