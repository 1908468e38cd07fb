"""Detection loading (issue 18): torchvision's `CocoDetection` + `transforms.v2` against `fastdata.loader` over the
same COCO images and annotations converted with `fastdata convert coco`, in one run.

From the benchmarks' sample photos (`--images`, JPEG) it builds, once, under --data:
  - a COCO instances file over those photos: 1-6 annotations an image, each a polygon (a random convex-ish shape)
    with its box and area, in 5 categories of non-contiguous ids;
  - `fastdata.convert_coco(...)` to LMDB and to WebDataset shards (untimed; the conversion time is printed).
Then loading, every loader giving `(images uint8 [B, 3, S, S], list of B target dicts)` per batch (S = --size):
  (a) torchvision's detection reference recipe: `CocoDetection` wrapped by `wrap_dataset_for_transforms_v2`
      (target keys boxes, labels, image_id; with --masks also masks), transforms `ScaleJitter((S, S),
      scale_range)` + a fixed-size crop padded to S x S at the bottom right (the references' FixedSizeCrop) +
      `RandomHorizontalFlip()` + `SanitizeBoundingBoxes()` + `PILToTensor`, images stacked and targets listed by
      the collate function;
  (b) `fastdata.loader` over the LMDB conversion, (c) over the WebDataset conversion (`augment="train"`,
      `augment=ScaleJitterCrop(S, scale_range)`; with --masks, `masks=True`).
The loaders are treated alike as in every loading benchmark (benchmarks/README.md, "Fair by construction"); the
table gives medians and ratios against the baseline (median of the per-run ratios). The target of issue 18:
fastdata at least 2x the torchvision pipeline.

    python -m benchmarks.detection --images 3000 --repeats 3
    python -m benchmarks run detection --smoke                 # smoke test

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

import fastdata
from benchmarks.common import arguments, cached_sample_imagefolder, convert_once, loading_race
from fastdata.formats.manifest import read_manifest
from fastdata.presets import ScaleJitterCrop
from fastdata.tools.bench import BenchConfig, Contender, LoaderResult
from fastdata.tools.bench_fair import dataset_files

TARGET = 2.0  # issue 18: fastdata at least 2x torchvision's CocoDetection + transforms.v2
CATEGORIES = [{"id": i, "name": name} for i, name in ((3, "car"), (7, "train"), (18, "dog"), (44, "bottle"),
                                                         (90, "zebra"))]

# ---------------------------------------------------------------------------------------------- the source


def write_annotations(src: Path, out: Path, seed: int = 0) -> Path:
    """A COCO instances file over the photos of `src` (file names relative to it), written once."""
    if out.is_file():
        return out
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for number, path in enumerate(sorted(p for p in src.rglob("*") if p.is_file())):
        with Image.open(path) as image:
            width, height = image.size
        images.append({"id": number + 1, "file_name": str(path.relative_to(src)), "width": width, "height": height})
        for _ in range(int(rng.integers(1, 7))):
            cx, cy = rng.uniform(0.1, 0.9) * width, rng.uniform(0.1, 0.9) * height
            rx, ry = rng.uniform(0.03, 0.3) * width, rng.uniform(0.03, 0.3) * height
            angles = np.sort(rng.uniform(0, 2 * np.pi, 8))
            xs = np.clip(cx + rx * np.cos(angles), 0, width)
            ys = np.clip(cy + ry * np.sin(angles), 0, height)
            polygon = np.stack([xs, ys], axis=1).ravel().round(2).tolist()
            area = 0.5 * abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1)))
            annotations.append({"id": len(annotations) + 1, "image_id": number + 1, "iscrowd": 0,
                                "category_id": CATEGORIES[int(rng.integers(len(CATEGORIES)))]["id"],
                                "segmentation": [polygon], "area": float(area),
                                "bbox": [float(xs.min()), float(ys.min()), float(xs.max() - xs.min()),
                                         float(ys.max() - ys.min())]})
    out.write_text(json.dumps({"images": images, "annotations": annotations, "categories": CATEGORIES}))
    return out


# ---------------------------------------------------------------------------------------------- loaders


class FixedSizeCrop:
    """torchvision's detection references' FixedSizeCrop: a random window of at most size x size, padded with 0 at
    the right and bottom to size x size (boxes and masks with it, through transforms.v2's functionals)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Any, target: dict) -> tuple[Any, dict]:
        import torch
        from torchvision.transforms.v2 import functional as F

        height, width = F.get_size(image)
        crop_h, crop_w = min(self.size, height), min(self.size, width)
        top = int(torch.randint(0, height - crop_h + 1, ()))
        left = int(torch.randint(0, width - crop_w + 1, ()))
        padding = [0, 0, self.size - crop_w, self.size - crop_h]
        image = F.pad(F.crop(image, top, left, crop_h, crop_w), padding)
        target = {k: F.pad(F.crop(v, top, left, crop_h, crop_w), padding) if k in ("boxes", "masks") else v
                  for k, v in target.items()}
        return image, target


def collate(batch: list[tuple[Any, dict]]) -> tuple[Any, list[dict]]:
    """Images stacked (one canvas size), targets as a list: the detection references' batch shape."""
    import torch

    return torch.stack([image for image, _ in batch]), [target for _, target in batch]


def torchvision_contender(src: Path, annotations: Path, config: BenchConfig, size: int, scale: tuple[float, float],
                          masks: bool) -> Contender:
    import torch
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2

    transforms = v2.Compose([v2.ScaleJitter((size, size), scale_range=scale), FixedSizeCrop(size),
                             v2.RandomHorizontalFlip(), v2.SanitizeBoundingBoxes(), v2.PILToTensor()])
    keys = ("boxes", "labels", "image_id") + (("masks",) if masks else ())
    settings = config.settings

    def make() -> Iterable:
        data = wrap_dataset_for_transforms_v2(CocoDetection(str(src), str(annotations), transforms=transforms),
                                              target_keys=keys)
        return torch.utils.data.DataLoader(data, batch_size=config.batch_size, shuffle=True, collate_fn=collate,
                                           **settings.dataloader_kwargs())

    files = [p for p in src.rglob("*") if p.is_file()] + [annotations]
    per_image = sum(f.stat().st_size for f in files) / max(1, len(files) - 1)
    return Contender(LoaderResult("torchvision CocoDetection + transforms.v2", role="baseline"), make, per_image,
                     files)


def fastdata_contender(path: Path, config: BenchConfig, name: str, size: int, scale: tuple[float, float],
                       masks: bool) -> Contender:
    manifest = read_manifest(path)
    settings = config.settings

    def make() -> Iterable:
        return fastdata.loader(path, batch_size=config.batch_size, augment=ScaleJitterCrop(size, scale_range=scale),
                               masks=masks, **settings.loader_kwargs())

    return Contender(LoaderResult(name), make, manifest.data_bytes / max(1, manifest.num_samples),
                     dataset_files(path))


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = arguments(__doc__, images=3000, epochs=2, batch_size=32, workers=None)
    parser.add_argument("--size", type=int, default=640, help="The canvas side.")
    parser.add_argument("--scale", type=float, nargs=2, default=(0.1, 2.0), help="The scale jitter range.")
    parser.add_argument("--masks", action="store_true", help="Load instance masks too.")
    args = parser.parse_args()

    config = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, augment="train", workers=args.workers,
                         repeats=args.repeats)
    scale = (args.scale[0], args.scale[1])
    src = cached_sample_imagefolder(args.data, args.images, jpeg_only=True)
    here = args.data / f"coco-{args.images}"
    here.mkdir(parents=True, exist_ok=True)
    annotations = write_annotations(src, here / "instances.json")
    outputs = {"lmdb": here / "coco.lmdb", "wds": here / "coco-wds"}
    convert_once(outputs, lambda fmt, out: fastdata.convert_coco(
        annotations, src, out, fastdata.CocoOptions(format=fmt, workers=args.workers, progress=False)))
    count = read_manifest(outputs["lmdb"]).num_samples

    print(f"\nDataLoader settings for every loader (fastdata.loader given the same): {config.settings}")
    contenders = [
        torchvision_contender(src, annotations, config, args.size, scale, args.masks),
        fastdata_contender(outputs["lmdb"], config, "fastdata.loader, coco -> LMDB", args.size, scale, args.masks),
        fastdata_contender(outputs["wds"], config, "fastdata.loader, coco -> WebDataset", args.size, scale,
                           args.masks),
    ]
    loading_race(f"loading detection, scale jitter {scale} into {args.size} x {args.size}, "
                 f"flip{', masks' if args.masks else ''}: {config.warmup_passes} untimed + {config.epochs} timed "
                 f"passes per run, batch {config.batch_size}, {config.num_workers} workers, {config.repeats} "
                 "alternating runs", contenders, config, f"{count:,} images", TARGET, unit="img/s")


if __name__ == "__main__":
    main()
