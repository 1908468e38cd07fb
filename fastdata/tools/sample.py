"""A built-in ImageNet-like sample: an ImageFolder tree of photo JPEGs (around 500x375, some progressive,
some grayscale, some PNG), cut from the photographs bundled with scikit-image. Without scikit-image
installed, smooth synthetic scenes stand in (and the caller is told)."""

from __future__ import annotations

import importlib.util
import io
import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image

_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg", "ihc.png",
           "motorcycle_left.png", "motorcycle_right.png", "retina.jpg", "rocket.jpg")
_GRAY_PHOTOS = ("camera.png", "brick.png", "grass.png", "gravel.png", "coins.png", "moon.png")


def photo_paths() -> tuple[list[Path], list[Path]]:
    """(colour, grayscale) photographs bundled with scikit-image, or ([], []) when it is not installed."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        return [], []
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    colour = [data / n for n in _PHOTOS if (data / n).is_file()]
    gray = [data / n for n in _GRAY_PHOTOS if (data / n).is_file()]
    return colour, gray


@dataclass(frozen=True)
class _Job:
    index: int
    path: Path
    source: Path | None
    seed: int


def _synthetic(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    from PIL import Image, ImageFilter

    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.zeros((height, width, 3), np.float32)
    for c in range(3):
        fx, fy = rng.uniform(0.002, 0.03, 2).tolist()
        phase = rng.uniform(0, 6.3)
        image[..., c] = 128 + 90 * np.sin(fx * x + fy * y + phase)
    for _ in range(12):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(10, 120)
        mask = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        image[mask] = rng.uniform(0, 255, 3)
    im = Image.fromarray(image.clip(0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(2))
    return im


def _make_one(job: _Job) -> int:
    from PIL import Image, ImageEnhance

    rng = np.random.default_rng(job.seed)
    width = int(rng.integers(400, 641))
    height = round(width * float(rng.choice([0.75, 0.75, 0.75, 2 / 3, 1.0, 4 / 3])))
    if job.source is None:
        im = _synthetic(rng, width, height)
    else:
        with Image.open(job.source) as src:
            src = src.convert("RGB")
            sw, sh = src.size
            aspect = width / height
            area = sw * sh * rng.uniform(0.35, 1.0)
            cw = min(sw, round((area * aspect) ** 0.5))
            ch = min(sh, round(cw / aspect))
            left, top = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
            im = src.crop((left, top, left + cw, top + ch)).resize((width, height), Image.Resampling.BICUBIC)
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    im = ImageEnhance.Brightness(im).enhance(rng.uniform(0.8, 1.2))
    im = ImageEnhance.Color(im).enhance(rng.uniform(0.7, 1.3))
    noise = rng.normal(0, 2, (height, width, 1)).astype(np.int16)  # a little sensor noise, as in real photos
    pixels = np.asarray(im, dtype=np.int16) + noise
    im = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    kind = rng.random()
    out = io.BytesIO()
    if job.path.suffix.lower() == ".png":
        im.save(out, "PNG", compress_level=1)
    elif kind < 0.06:
        im.convert("L").save(out, "JPEG", quality=int(rng.integers(75, 96)))
    elif kind < 0.12:
        im.save(out, "JPEG", quality=int(rng.integers(75, 96)), progressive=True)
    else:
        im.save(out, "JPEG", quality=int(rng.integers(75, 96)))
    job.path.write_bytes(out.getvalue())
    return len(out.getvalue())


def make_sample_imagefolder(root: str | Path, images: int = 1200, classes: int = 10, seed: int = 0,
                            png_fraction: float = 0.04, workers: int | None = None) -> Path:
    """Write an ImageFolder tree of `images` photos in `classes` classes under `root`; returns `root`.
    Deterministic for a seed. Uses scikit-image's photographs when installed (see `photo_paths`)."""
    root = Path(root)
    colour, gray = photo_paths()
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(images):
        label = i % classes
        ext = ".png" if rng.random() < png_fraction else rng.choice([".JPEG", ".jpg"])
        folder = root / f"class_{label:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        pool = colour if (rng.random() > 0.1 or not gray) else gray
        source = pool[int(rng.integers(len(pool)))] if pool else None
        jobs.append(_Job(i, folder / f"img_{i:06d}{ext}", source, int(rng.integers(2**31))))
    if workers == 1 or images < 64:
        list(map(_make_one, jobs))
    else:
        with multiprocessing.get_context().Pool(workers) as pool_:
            list(pool_.imap_unordered(_make_one, jobs, chunksize=16))
    return root

