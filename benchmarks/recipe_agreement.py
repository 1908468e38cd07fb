"""How the recipes' operations agree with torchvision's (deterministic: no timing): every operation of
TrivialAugmentWide, RandAugment and AutoAugment at every magnitude bin and sign, applied by
`fastdata.image.recipes.ops` and by torchvision's own dispatch (`_apply_image_or_video_transform`, what its
policies call) to the same uint8 crops, the RandomResizedCrop 224 crops fastdata's train preset makes of the
sample photos.

Each cell is "mean / max" absolute grey-level difference over the crops' pixels, for the worse sign of that bin;
the last column is the largest share of pixels that differ at all, over every bin and sign. Tables: the
TrivialAugmentWide space and the RandAugment / AutoAugment space at nearest (torchvision's default), and the
geometric operations at bilinear (torchvision's reference recipes).

    python -m benchmarks.recipe_agreement [--images 16]
"""

from __future__ import annotations

import numpy as np
import torch
from torchvision.transforms import v2

import fastdata
from benchmarks import report
from benchmarks.common import arguments, dataset_for
from fastdata.image.recipes.ops import OPERATIONS, OpContext
from fastdata.image.recipes.policies import magnitudes, space

SIZE = 224
COLUMNS = (0, 5, 10, 15, 20, 25, 30)  # the magnitude bins shown (of 31)
GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


def crops(images: int, data) -> list[np.ndarray]:
    """The first `images` train-preset crops (224 px) of the sample photos, HWC uint8."""
    loader = fastdata.loader(dataset_for(data, max(images, 60)), batch_size=images, augment="train",
                             image_size=SIZE, shuffle=False, num_workers=0, seed=0)
    batch, _ = next(iter(loader))
    return [np.ascontiguousarray(image.permute(1, 2, 0).numpy()) for image in batch]


def difference(name: str, magnitude: float, interpolation: str, images: list[np.ndarray]) -> np.ndarray:
    """|fastdata - torchvision| over every pixel of `images`, operation `name` at `magnitude`."""
    policy = v2.AutoAugment()  # any policy: its dispatch applies whichever operation it is given
    mode = v2.InterpolationMode(interpolation)
    found = []
    for image in images:
        theirs = policy._apply_image_or_video_transform(torch.from_numpy(image).permute(2, 0, 1).contiguous(),
                                                        name, magnitude, interpolation=mode, fill=policy._fill)
        ours = image.copy()
        OPERATIONS[name](ours, magnitude, OpContext(interpolation=interpolation))
        found.append(np.abs(ours.astype(np.int16) - theirs.permute(1, 2, 0).numpy().astype(np.int16)).ravel())
    return np.concatenate(found)


def cell(diffs: list[np.ndarray]) -> str:
    worst = max(diffs, key=lambda d: (d.mean(), d.max()))
    mean = worst.mean()
    return f"{mean:.3g} / {worst.max()}" if mean else f"0 / {worst.max()}"


def space_table(title: str, wide: bool, names: list[str], interpolation: str, images: list[np.ndarray],
                columns: tuple[int, ...]) -> None:
    rows = []
    for name in names:
        values = magnitudes(wide, name, 31, SIZE, SIZE)
        signed = space(wide)[name][1]
        cells, share = [], 0.0
        for index in range(31):
            magnitude = 0.0 if values is None else values[index]
            diffs = [difference(name, magnitude * sign, interpolation, images)
                     for sign in ((1, -1) if signed else (1,))]
            share = max([share, *((d > 0).mean() for d in diffs)])
            if index in columns:
                cells.append(cell(diffs))
            if values is None:  # no magnitude: every bin is this one
                cells = [cells[0]] * len(columns)
                break
        rows.append([name, *cells, f"{100 * share:.2g}%"])
    report.table(title, ["operation", *(f"bin {c}" for c in columns), "pixels differing (worst)"], rows,
                 align="l" + "r" * (len(columns) + 1),
                 notes=[f"{len(images)} crops of {SIZE} x {SIZE} px; cells: mean / max |fastdata - torchvision| in "
                        "grey levels, the worse sign of the bin"])


def main() -> None:
    parser = arguments(__doc__, images=16, repeats=1)
    parser.add_argument("--bins", type=int, nargs="*", default=list(COLUMNS), help="the bins shown (of 31)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # torchvision's operations on one crop: threads only contend
    images = crops(args.images, args.data)
    columns = tuple(args.bins)
    space_table("TrivialAugmentWide's operations and bins (nearest, torchvision's default) vs torchvision", True,
                list(space(True)), "nearest", images, columns)
    space_table("RandAugment's operations and bins, and AutoAugment's Invert (nearest) vs torchvision (AutoAugment's "
                "10 bins are other points of the same ranges)", False,
                list(space(False)), "nearest", images, columns)
    space_table("the geometric operations at bilinear (torchvision's reference recipes), TrivialAugmentWide's "
                "bins", True, list(GEOMETRIC), "bilinear", images, columns)


if __name__ == "__main__":
    main()
