"""WebDataset shards as other tools write them (the `webdataset` library's ShardWriter; read by
fastdata.converters.webdataset), and the library's own reading of shards."""

from __future__ import annotations

from pathlib import Path

from .images import Tree, solid_id_of_path, solid_label
from .sources import multi_labels

#: Class names of the solid samples in WebDataset sources labelled by name: first met in the opposite of sorted order.
WDS_NAMES = ("zebra", "yak", "xerus")


def wds_key(sample_id: int) -> str:
    return f"sample{sample_id:04d}"


def wds_sample(tree: Tree, relative: str, labels: str | None = "cls", caption: bool = True) -> dict:
    """The solid image `relative` of `tree` as a webdataset sample (key `wds_key(id)`, the image's bytes under its
    extension), with a `.json` of metadata ({"id", "url", "score", "tags", "nothing"}), a `.txt` caption and its
    label: `labels="cls"` a `.cls` member (the solid class id); "name" the .json "label" (its `WDS_NAMES` name);
    "multi" the .json "label" as the list of the names of its `multi_labels`; None no label."""
    sample_id = solid_id_of_path(relative)
    meta = {"id": sample_id, "url": f"https://example.com/{sample_id}.jpg", "score": sample_id / 4,
            "tags": ["t", sample_id], "nothing": None}
    sample = {"__key__": wds_key(sample_id), relative.rsplit(".", 1)[1]: tree.path(relative).read_bytes()}
    if labels == "cls":
        sample["cls"] = solid_label(sample_id)
    elif labels == "name":
        meta["label"] = WDS_NAMES[solid_label(sample_id)]
    elif labels == "multi":
        meta["label"] = [WDS_NAMES[c] for c in multi_labels(sample_id)]
    sample["json"] = meta
    if caption:
        sample["txt"] = f"a photo of sample {sample_id}"
    return sample


def write_wds_shards(directory: Path, samples: list[dict], maxcount: int = 6, pattern: str = "part-%06d.tar"
                     ) -> list[Path]:
    """`samples` written by webdataset's ShardWriter into `directory` (`maxcount` samples a shard); the shards."""
    import webdataset as wds

    directory.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(directory / pattern), maxcount=maxcount, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    return sorted(directory.glob("*.tar"))


def webdataset_reading(shards: list[Path]) -> list[dict]:
    """The samples of `shards` as the `webdataset` library itself reads them (raw bytes, in order)."""
    import webdataset as wds

    return list(wds.WebDataset([str(p) for p in shards], shardshuffle=False))
