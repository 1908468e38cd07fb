"""File lists (fastdata convert list) of the solid tree, written with pandas."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .images import SOLID_CLASSES, Tree, solid_id_of_path, solid_label
from .sources import multi_labels, solid_metadata


def list_frame(tree: Tree, labels: str = "names", prefix: str = "", seed: int = 5):
    """A pandas DataFrame listing the solid `tree`'s images in a shuffled order (so that row order is not path
    order): `path` (`prefix` + the tree-relative path), `label` and the `solid_metadata` columns. `labels`:
    "names" (class names), "ids" (class ids), "name-sets" / "id-sets" (lists of names / ids: `multi_labels`)."""
    import pandas as pd

    order = np.random.default_rng(seed).permutation(len(tree.images))
    rows = []
    for index in order:
        relative = tree.images[index]
        sample_id = solid_id_of_path(relative)
        label = listed_label(sample_id, labels)
        rows.append({"path": prefix + relative, "label": label, **solid_metadata(sample_id)})
    return pd.DataFrame(rows)


def listed_label(sample_id: int, labels: str = "names"):
    """Solid sample `sample_id`'s label as `list_frame` lists it."""
    if labels == "names":
        return SOLID_CLASSES[solid_label(sample_id)]
    if labels == "ids":
        return solid_label(sample_id)
    ids = multi_labels(sample_id)
    return [SOLID_CLASSES[c] for c in ids] if labels == "name-sets" else list(ids)


def write_list(frame, path: Path) -> Path:
    """`frame` written as the list file `path`, in the format its suffix names, as pandas writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, index=False, sep="\t")
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True, force_ascii=False)
    elif suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:  # pragma: no cover - a typo in a test
        raise AssertionError(suffix)
    return path
