"""Augmentation: the train/val presets (crop box drawn from the image size before decoding, then one OpenCV
resize), and an adapter for any albumentations transform or plain callable.

The presets are split into `params()` (pure: image size + RNG -> crop box and flip) and `apply()` (pixels),
so that the decoder can decode only at the scale the crop needs, and so that a later GPU path can draw the
same parameters on the CPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.errors import ConfigError
from fastdata.image.decode import opencv_single_threaded
from fastdata.image.geometry import CropParams, ImageSize, bounds, output_size, pixel_box, stable_size


@dataclass(frozen=True)
class RandomResizedCropFlip:
    """torchvision's RandomResizedCrop (same sampling of area and log-aspect, 10 tries, central fallback)
    followed by a horizontal flip with probability `flip_p`. `size` is a side or (height, width); `scale` bounds
    the crop's share of the image area, `ratio` its aspect (width / height), as torchvision's arguments."""

    size: ImageSize
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", stable_size(self.size))
        object.__setattr__(self, "scale", bounds("scale", self.scale, upper=1.0))
        object.__setattr__(self, "ratio", bounds("ratio", self.ratio))

    @property
    def out_size(self) -> tuple[int, int]:
        """(height, width) of the output."""
        return output_size(self.size)

    def params(self, width: int, height: int, rng: np.random.Generator) -> CropParams:
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return CropParams(left, top, w, h, bool(rng.random() < self.flip_p))
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif in_ratio > max(self.ratio):
            h, w = height, round(height * max(self.ratio))
        else:
            w, h = width, height
        return CropParams((width - w) // 2, (height - h) // 2, w, h, bool(rng.random() < self.flip_p))


@dataclass(frozen=True)
class ResizeCenterCrop:
    """Validation preset, torchvision's `Resize(int(size / crop_fraction))` + `CenterCrop(size)` as one crop box:
    the image is resized (keeping its aspect) to the smallest size that covers `int(side / crop_fraction)` on
    both sides, i.e. its shorter side to `int(size / crop_fraction)` for a square `size` and its longer side to
    `int(long * that / short)`, truncated as torchvision does; the centre `size` of that (offsets rounded as
    CenterCrop rounds them) is the crop. `size` is a side or (height, width) (then the cover is of
    (int(height / crop_fraction), int(width / crop_fraction)), as timm's ResizeKeepRatio + CenterCrop)."""

    size: ImageSize
    crop_fraction: float = 0.875

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", stable_size(self.size))
        if not 0 < self.crop_fraction <= 1:
            raise ConfigError(f"crop_fraction must be in (0, 1], got {self.crop_fraction!r}")

    @property
    def out_size(self) -> tuple[int, int]:
        """(height, width) of the output."""
        return output_size(self.size)

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) the image is resized to before the centre crop (torchvision's Resize arithmetic)."""
        out_h, out_w = self.out_size
        cover_h, cover_w = int(out_h / self.crop_fraction), int(out_w / self.crop_fraction)
        if cover_h * width >= cover_w * height:  # the height decides (for a square size: the shorter side)
            new_h, new_w = cover_h, int(cover_h * width / height)
        else:
            new_h, new_w = int(cover_w * height / width), cover_w
        return max(new_h, out_h), max(new_w, out_w)

    def params(self, width: int, height: int, rng: np.random.Generator | None = None) -> CropParams:
        out_h, out_w = self.out_size
        new_h, new_w = self.resized_size(width, height)
        top, left = round((new_h - out_h) / 2.0), round((new_w - out_w) / 2.0)  # CenterCrop's anchor (round half even)
        sx, sy = width / new_w, height / new_h  # source pixels per resized pixel
        return CropParams(left * sx, top * sy, out_w * sx, out_h * sy, False)


Preset = RandomResizedCropFlip | ResizeCenterCrop
DEFAULT_IMAGE_SIZE = 224  # the presets' output side when image_size is not given


def crop_resize_flip(image: np.ndarray, box: tuple[float, float, float, float], out: np.ndarray,
                     flip: bool) -> None:
    """Resize the box (left, top, width, height) of `image` (image pixels, fractional allowed) into `out`
    (H x W x 3, uint8), mirrored if `flip`: crop, resize and flip in one OpenCV call, no float conversion.

    Bilinear, with sub-pixel box edges (an affine warp: pixel centres map exactly as in torchvision's
    resized_crop), is accurate below a 2x shrink, which is where the decoder's DCT scaling leaves most JPEG crops;
    an axis shrunk 2x or more is first halved (pairs of pixels averaged) until it is not, so as not to alias
    (as Pillow's reducing_gap does), then warped."""
    import cv2

    opencv_single_threaded()  # any process that crops: warpAffine would use OpenCV's pool (see its docstring)
    left, top, width, height = box
    out_h, out_w = out.shape[:2]
    sx, sy = width / out_w, height / out_h
    while max(sx, sy) >= 2:
        image, (left, top, width, height) = _halve(image, (left, top, width, height), sx >= 2, sy >= 2)
        sx, sy = width / out_w, height / out_h
    # inverse map, output pixel centre -> source position: x_src = left + (x + 0.5) * sx - 0.5 (mirrored: x -> W-1-x)
    row_x = (-sx, 0.0, left + (out_w - 0.5) * sx - 0.5) if flip else (sx, 0.0, left + 0.5 * sx - 0.5)
    matrix = np.array([row_x, (0.0, sy, top + 0.5 * sy - 0.5)])
    cv2.warpAffine(image, matrix, (out_w, out_h), dst=out, flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                   borderMode=cv2.BORDER_REPLICATE)


def _halve(image: np.ndarray, box: tuple[float, float, float, float], along_x: bool, along_y: bool
           ) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """The pixels under `box`, with each pair of pixels averaged along x and/or y (a bilinear resize to exactly
    half a side samples midway between two pixels: a 2-pixel box filter, OpenCV's fast path; INTER_AREA at a
    ratio other than 2x2 measured 5-10x slower), and `box` in the result. Only pixels the box touches are read
    (an odd count gets its last pixel repeated), so a region decode and a whole-image decode give the same
    result. Pixel i of a halved axis averages pixels x0 + 2i and x0 + 2i + 1: edge coordinate e -> (e - x0) / 2."""
    import cv2

    left, top, width, height = box
    x0, y0, x1, y1 = pixel_box(left, top, width, height, image.shape[1], image.shape[0], cover=True)
    pixels = image[y0:y1, x0:x1]
    pad_x, pad_y = (x1 - x0) % 2 if along_x else 0, (y1 - y0) % 2 if along_y else 0
    if pad_x or pad_y:
        pixels = cv2.copyMakeBorder(pixels, 0, pad_y, 0, pad_x, cv2.BORDER_REPLICATE)
    kx, ky = (2 if along_x else 1), (2 if along_y else 1)
    halved = cv2.resize(pixels, (pixels.shape[1] // kx, pixels.shape[0] // ky), interpolation=cv2.INTER_LINEAR)
    return halved, ((left - x0) / kx, (top - y0) / ky, width / kx, height / ky)


def apply_crop(image: np.ndarray, params: CropParams, out: np.ndarray, scale: float = 1.0) -> None:
    """Crop `params` (given in source pixels; `image` is the source at 1/`scale`, e.g. a JPEG decoded at
    1/`scale` by DCT scaling) and resize into `out` (H x W x 3, uint8), mirrored if asked."""
    box = (params.left / scale, params.top / scale, params.width / scale, params.height / scale)
    crop_resize_flip(image, box, out, params.flip)


def make_preset(name: str, image_size: Any = None, scale: Any = None, ratio: Any = None) -> Preset:
    """The named preset ("train" or "val") for output size `image_size` (a side or (height, width); None: 224),
    with RandomResizedCrop's `scale` and `ratio` for "train" (None: torchvision's defaults)."""
    size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
    if name == "train":
        crop = {k: v for k, v in (("scale", scale), ("ratio", ratio)) if v is not None}
        return RandomResizedCropFlip(size, **crop)
    if name == "val":
        if scale is not None or ratio is not None:
            raise ConfigError("scale and ratio are RandomResizedCrop's, for augment='train'; augment='val' takes "
                              "the centre crop")
        return ResizeCenterCrop(size)
    raise ConfigError(f"unknown augment preset {name!r}: use 'train', 'val', an albumentations transform, a "
                      "torchvision transform, a callable on an HWC uint8 array, or None")


def check_custom(augment: Any, image_size: Any = None, scale: Any = None, ratio: Any = None) -> None:
    """Refuse the presets' options with a custom transform (or None), which sets its own size and crop."""
    given = [name for name, value in (("image_size", image_size), ("scale", scale), ("ratio", ratio))
             if value is not None]
    if not given:
        return
    what = "augment=None gives whole images" if augment is None else \
        f"the custom transform {type(augment).__name__} sets its own size and crop"
    one = len(given) == 1
    raise ConfigError(f"{', '.join(given)} appl{'ies' if one else 'y'} to augment='train'/'val' only; {what}: "
                      f"leave {'it' if one else 'them'} out")


def describe_augment(augment: Any) -> str | None:
    """What a transform does, as stable text, so that a loader state taken with one transform is refused by a
    loader with another: presets (the objects, or names: default options) with every parameter (size, crop
    scale and ratio, flip); albumentations pipelines as albumentations serialises them; other callables by their
    qualified name."""
    if augment is None:
        return None
    if isinstance(augment, str):
        augment = make_preset(augment)
    if isinstance(augment, RandomResizedCropFlip | ResizeCenterCrop) or (
            dataclasses.is_dataclass(augment) and not isinstance(augment, type)):  # presets (detection's too)
        return repr(augment)
    try:
        import json

        import albumentations as A

        if isinstance(augment, A.BasicTransform | A.BaseCompose):
            described = {k: v for k, v in A.to_dict(augment).items() if k != "__version__"}
            return json.dumps(described, sort_keys=True, default=repr)
    except (ImportError, NotImplementedError, TypeError, ValueError):  # not serialisable: fall back to its name
        pass
    kind = augment if callable(augment) and hasattr(augment, "__qualname__") else type(augment)
    module = getattr(kind, "__module__", None) or type(augment).__module__
    return f"{module}.{getattr(kind, '__qualname__', repr(kind))}"


CustomResult = Any  # an HWC array, a CHW tensor or a PIL image: see fastdata.image.pipeline.as_chw


def wrap_custom(transform: Any) -> Callable[[np.ndarray, int], CustomResult]:
    """Adapt a custom transform to `fn(hwc_uint8_rgb, sample_seed) -> result`, each in the form it expects:

    - albumentations (`t(image=hwc)["image"]`, reseeded per sample): an HWC array, or with `ToTensorV2` a CHW
      tensor;
    - torchvision transforms.v2 (a `v2.Transform`, `v2.Compose` included): called on a uint8 CHW tensor,
      torchvision's convention; v1 `torchvision.transforms` (PIL-based): called on a PIL image;
    - a plain callable `f(hwc_uint8)`, or `f(hwc_uint8, rng=np.random.Generator)` when it has an `rng` parameter
      (then the Generator is seeded for the sample).

    torchvision transforms and plain callables without `rng` run with the global RNGs (random, numpy, torch)
    seeded for the sample (`SeededGlobalRngs`)."""
    compose = albumentations_compose(transform)
    if compose is not None:

        def run_album(image: np.ndarray, seed: int) -> CustomResult:
            compose.set_random_seed(seed)
            return compose(image=image)["image"]

        return run_album
    if not callable(transform):
        raise ConfigError(f"augment must be 'train', 'val', None, an albumentations or torchvision transform or a "
                          f"callable, got {type(transform).__name__}")
    convention = torchvision_convention(transform)
    if convention is None and _takes_rng(transform):
        return lambda image, seed: transform(image, rng=np.random.default_rng(seed))
    convert: Callable[[np.ndarray], Any] = {"v2": _chw_tensor, "v1": _pil_image}.get(convention or "",
                                                                                      lambda image: image)

    def run_seeded(image: np.ndarray, seed: int) -> CustomResult:
        converted = convert(image)
        with SeededGlobalRngs(seed):
            return transform(converted)

    return run_seeded


def albumentations_compose(transform: Any) -> Any:
    """An albumentations transform as a Compose that can be reseeded per sample (`set_random_seed`): a Compose as
    it is, a single transform wrapped in one; None for anything that is not albumentations."""
    try:
        import albumentations as A
    except ImportError:  # pragma: no cover - albumentations is a dependency
        return None
    if not isinstance(transform, A.BasicTransform | A.BaseCompose):
        return None
    return transform if hasattr(transform, "set_random_seed") else A.Compose([transform])


def torchvision_convention(transform: Any) -> str | None:
    """"v2" for a torchvision transforms.v2 transform (tensors in), "v1" for one of the older
    `torchvision.transforms` (PIL images in), None for anything else. Checked only when torchvision is imported
    (a torchvision transform cannot exist otherwise)."""
    import sys

    if "torchvision" not in sys.modules:
        return None
    from torchvision.transforms import v2

    if isinstance(transform, v2.Transform):
        return "v2"
    module = type(transform).__module__ or ""
    if module.startswith("torchvision.transforms") and not module.startswith("torchvision.transforms.v2"):
        return "v1"
    return None


def _chw_tensor(image: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(image).permute(2, 0, 1).contiguous()


def _pil_image(image: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(image)


def _takes_rng(transform: Callable) -> bool:
    """Whether `transform` accepts an `rng` keyword (then it gets the sample's numpy Generator)."""
    import inspect

    try:
        parameters = inspect.signature(transform).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return "rng" in parameters


class SeededGlobalRngs:
    """Seed Python's `random`, numpy's global RNG and torch's CPU RNG from one sample's seed for the duration of a
    transform call, so that a plain callable drawing from the global RNGs gives the same result for the same
    (seed, epoch, sample) whatever process runs it. Outside DataLoader workers (num_workers=0: the training
    process) the states they had are put back afterwards, so the caller's own random streams are left as they
    were (about 0.2 ms, mostly numpy's state copy; workers skip it: their global RNGs are theirs)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._saved: tuple[Any, Any, Any] | None = None

    def __enter__(self) -> None:
        import random

        import torch

        if torch.utils.data.get_worker_info() is None:
            self._saved = (random.getstate(), np.random.get_state(), torch.default_generator.get_state())
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.default_generator.manual_seed(self.seed)  # CPU only: torch.manual_seed also starts CUDA's RNGs

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            return
        import random

        import torch

        python_state, numpy_state, torch_state = self._saved
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.default_generator.set_state(torch_state)
        self._saved = None
