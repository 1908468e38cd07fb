"""The device path's one batched crop-resize-flip: every image of a batch, whatever its size, in one batched pass,
no kernel per image: the resampling's launches depend neither on how many images the batch holds nor on their
shrink factors; only gathering the decoded images into one buffer (`torch.cat`) launches more as the batch grows.

Resampling is torchvision's `resized_crop(..., antialias=True)` (Pillow's bilinear filter: a triangle whose radius
is the shrink factor, so downscaling averages every pixel under the output pixel; plain bilinear when enlarging),
applied to the crop box's covering pixels, with sub-pixel box edges (the "val" preset's boxes are fractional). It is
separable, so each crop is resized by two matrix products, `rows @ crop @ columns`, batched over the whole batch:

1. the decoded images (CHW uint8, any sizes) are concatenated into one flat buffer;
2. one gather copies every crop's covering rows out of it, each as a window as wide as the batch's widest crop, into
   a padded [n, height, C * width] block (rows past a crop's height repeat its last row; columns past its width
   hold the next pixels of the buffer);
3. two batched matrix products with dense weight matrices ([n, out_h, height] and [n, out_w, width], Pillow's
   weights evaluated at every pixel, each written in one fused pass on CUDA: `axis_weights`; a flip mirrors the
   columns' matrix) resize every crop at once; the padding gets weight 0.

Compared with gathering each output row's taps and summing them (the kernel before it, kept as the baseline of
benchmarks/resize_kernel.py), this moves far fewer bytes: each source pixel is read once, not once per tap, and the
sums run as matrix products, which is what a GPU does fastest. On CUDA the products take float16 operands (0..255
is exact in float16; the weights keep 11 bits), on the CPU float32. The result is float32 in 0..255, rounded by
the caller. A batch whose padded crops would exceed `MAX_BLOCK_BYTES` is done in several such passes (so only a
batch of very large photos takes more launches). The same code runs on the CPU (tests, CI) and on CUDA (where it
queues on the current stream and never waits).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class CropBatch:
    """Where each decoded image's crop is, on the host: what the kernel's sizes and launch count depend on.

    `boxes` float64 [n, 4]: left, top, width, height of the crop in the decoded image's pixels (fractional edges
    allowed); `shapes` int64 [n, 2]: each decoded image's (height, width); `flips` bool [n]."""

    boxes: np.ndarray
    shapes: np.ndarray
    flips: np.ndarray


def cover(boxes: np.ndarray, shapes: np.ndarray) -> np.ndarray:
    """Each box's covering whole pixels (x0, y0, x1, y1) inside its image: never empty, never outside
    (fastdata.image.augment.pixel_box with cover=True, for a whole batch)."""
    left, top, width, height = boxes.T
    image_h, image_w = shapes[:, 0], shapes[:, 1]
    x0 = np.clip(np.floor(left), 0, image_w - 1)
    y0 = np.clip(np.floor(top), 0, image_h - 1)
    x1 = np.minimum(np.maximum(np.ceil(left + width), x0 + 1), image_w)
    y1 = np.minimum(np.maximum(np.ceil(top + height), y0 + 1), image_h)
    return np.stack([x0, y0, x1, y1], axis=1).astype(np.int64)


#: Where a padding pixel's scaled coordinate is put: so far from every centre that its weight is 0
_FAR = 1e9


def taps(lengths: np.ndarray, out: int) -> int:
    """Pixels a triangle of radius max(length / out, 1) can cover, for the batch's largest (host arrays: known
    without asking the device), with a margin for rounding."""
    radius = max(float(lengths.max()) / out, 1.0) if len(lengths) else 1.0
    return 2 * math.ceil(radius) + 2


def axis_weights(start: torch.Tensor, length: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out: int,
                  extent: int, dtype: torch.dtype, taps: int, flip: torch.Tensor | None = None) -> torch.Tensor:
    """The dense resampling matrix along one axis, `dtype` [n, out, extent]: output pixel i of image b samples the
    box [start, start + length) at centre start + (i + 0.5) * scale (mirrored when `flip`) with a triangle of radius
    r = max(scale, 1) (Pillow's bilinear filter, antialiased when shrinking), over the covering pixels [lo, hi)
    only, numbered from lo (columns past hi - lo: padding, weight 0); each row of weights sums to 1. Evaluated at
    every pixel rather than scattered from a list of taps (no scatter: deterministic on CUDA).

    The pixels' and the centres' coordinates are divided by r beforehand (the padding's put `_FAR` away), and each
    row's sum comes from the `taps` pixels around its centre, on small [n, out], [n, extent] and [n, out, taps]
    tensors; the dense matrix is then written in one fused pass, max(0, 1 - |p - c|) / sum (`_dense`), and cast to
    `dtype`. Coordinates are taken relative to `lo` and divided in float64 before float32, so that large images
    keep their sub-pixel precision."""
    device = start.device
    scale = length / out  # [n] float64
    inverse_radius = 1 / scale.clamp(min=1.0)  # [n]
    i = torch.arange(out, device=device, dtype=torch.float64)[None, :]  # [1, out]
    if flip is not None:
        i = torch.where(flip[:, None], out - 1 - i, i)
    centre = start[:, None] - lo[:, None] + (i + 0.5) * scale[:, None]  # [n, out], from lo
    valid = (hi - lo)[:, None]  # [n, 1]: the covering pixels; past them, padding
    centres = (centre * inverse_radius[:, None]).float()  # [n, out]
    pixel = torch.arange(extent, device=device, dtype=torch.float64)[None, :] + 0.5  # pixel centres, from lo
    pixels = torch.where(pixel < valid, pixel * inverse_radius[:, None], _FAR).float()  # [n, extent]
    first = torch.floor(centre - 1 / inverse_radius[:, None] - 0.5) + 1  # [n, out]: the first pixel it covers
    tap = first[:, :, None] + torch.arange(taps, device=device, dtype=torch.float64)  # [n, out, taps]
    tapped = torch.where((tap >= 0) & (tap < valid[:, :, None]), (tap + 0.5) * inverse_radius[:, None, None],
                         _FAR).float()
    inverse = (1 - (tapped - centres[:, :, None]).abs()).clamp_(min=0).sum(-1, keepdim=True).clamp_(min=1e-12)
    return _dense(pixels, centres, inverse.reciprocal_(), dtype)


def _dense(pixels: torch.Tensor, centres: torch.Tensor, inverse: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[n, out, extent] `dtype`: max(0, 1 - |pixels[b, p] - centres[b, o]|) * inverse[b, o]. On CUDA one fused
    kernel (`_fused_weights`) then the cast; elsewhere (or where that kernel cannot be compiled) three passes: one
    fused |p - c| (`torch.cdist` on the CPU; a subtraction and an abs on CUDA), a clamp, and one fused scale-and-cast
    (`torch.addcmul` into the output)."""
    if pixels.device.type == "cuda":
        fused = _fused_weights()
        if fused is not None:
            return fused(pixels[:, None, :], centres[:, :, None], inverse).to(dtype)
        distance = torch.sub(pixels[:, None, :], centres[:, :, None]).abs_()
    else:
        distance = torch.cdist(centres[:, :, None], pixels[:, :, None], p=1)  # [n, out, extent]
    weights = torch.empty(distance.shape, dtype=dtype, device=distance.device)
    return torch.addcmul(inverse, distance.clamp_(max=1), inverse, value=-1, out=weights)  # (1 - d) / sum


_WEIGHTS_KERNEL = """
template <typename T> T resize_weight(T pixel, T centre, T inverse) {
    T distance = pixel > centre ? pixel - centre : centre - pixel;
    return distance < T(1) ? (T(1) - distance) * inverse : T(0);
}
"""


@functools.cache
def _fused_weights() -> Any:
    """The weights' one fused CUDA kernel (torch's jiterator, compiled on first use), or None where it cannot be
    made (said once: the weights then take a few more passes)."""
    try:
        from torch.cuda import jiterator

        fused = jiterator._create_jit_fn(_WEIGHTS_KERNEL)
        one = torch.ones(1, device="cuda")
        fused(one, one, one)  # compiled here, on first use
        return fused
    except Exception as exc:  # no NVRTC in this install, say
        warnings.warn(f"fastdata: the device path's resize weights are built without their fused kernel ({exc}); "
                      "a few more passes over them", RuntimeWarning, stacklevel=2)
        return None


MAX_BLOCK_BYTES = 1 << 30  # the padded crops of one pass at most (step 2 of the module's docstring)


def compute_dtype(device: torch.device) -> torch.dtype:
    """The matrix products' operand dtype on `device`: float16 on CUDA (tensor cores), float32 elsewhere."""
    return torch.float16 if device.type == "cuda" else torch.float32


def crop_resize_flip(images: list[torch.Tensor], crops: CropBatch, size: tuple[int, int],
                     dtype: torch.dtype | None = None) -> torch.Tensor:
    """Crop, resize (antialiased) and flip a batch of CHW uint8 RGB images of any sizes, all on one device, into
    one float32 [n, 3, H, W] tensor in 0..255 (not rounded). `crops` says where each crop is (host arrays, so that
    the launch count and buffer sizes are known without asking the device); their per-image numbers reach the
    device in one non-blocking copy (`device_params`). `dtype`: the matrix products' operands (`compute_dtype`
    of the device when None)."""
    n = len(images)
    out_h, out_w = size
    if n == 0:
        return torch.empty((0, 3, out_h, out_w), dtype=torch.float32)
    dtype = dtype or compute_dtype(images[0].device)
    covered = cover(crops.boxes, crops.shapes)
    passes = _passes(covered, images[0].shape[0] * torch.finfo(dtype).bits // 8)
    if len(passes) == 1:
        return _resize(images, crops, covered, size, dtype)
    return torch.cat([_resize(images[a:b], CropBatch(crops.boxes[a:b], crops.shapes[a:b], crops.flips[a:b]),
                              covered[a:b], size, dtype) for a, b in passes])


def _passes(covered: np.ndarray, bytes_per_pixel: int) -> list[tuple[int, int]]:
    """Consecutive runs of images whose padded crops (widest x tallest of the run) fit in MAX_BLOCK_BYTES; one run
    for any batch of ordinary photos."""
    widths, heights = covered[:, 2] - covered[:, 0], covered[:, 3] - covered[:, 1]
    if len(covered) * int(widths.max()) * int(heights.max()) * bytes_per_pixel <= MAX_BLOCK_BYTES:
        return [(0, len(covered))]  # the whole batch fits, so every run of it does
    runs, first, width, height = [], 0, 0, 0
    for i in range(len(covered)):
        width, height = max(width, int(widths[i])), max(height, int(heights[i]))
        if i > first and (i - first + 1) * width * height * bytes_per_pixel > MAX_BLOCK_BYTES:
            runs.append((first, i))
            first, width, height = i, int(widths[i]), int(heights[i])
    runs.append((first, len(covered)))
    return runs


def _resize(images: list[torch.Tensor], crops: CropBatch, covered: np.ndarray, size: tuple[int, int],
            dtype: torch.dtype) -> torch.Tensor:
    """Steps 1-3 of the module's docstring for one pass."""
    n = len(images)
    out_h, out_w = size
    device = images[0].device
    channels = images[0].shape[0]
    width = int((covered[:, 2] - covered[:, 0]).max())  # the widest crop: every gathered row's window
    height = int((covered[:, 3] - covered[:, 1]).max())  # the tallest crop: rows gathered per image
    left, top, box_w, box_h, x0, y0, x1, y1, image_h, image_w, base, flip = device_params(crops, covered,
                                                                                         device).unbind(1)
    flips = flip > 0.5
    windows = flat_windows(images, width)
    source_rows = torch.minimum(y0[:, None] + torch.arange(height, device=device, dtype=torch.float64)[None, :],
                                y1[:, None] - 1)  # [n, height]: past the crop's last row, that row again
    channel = torch.arange(channels, device=device, dtype=torch.float64)
    starts = (base[:, None, None] + channel[None, None, :] * (image_h * image_w)[:, None, None]
              + source_rows[:, :, None] * image_w[:, None, None] + x0[:, None, None]).long()  # [n, height, C]
    block = windows.index_select(0, starts.reshape(-1)).view(n, height, channels * width).to(dtype)

    vertical = axis_weights(top, box_h, y0, y1, out_h, height, dtype, taps(crops.boxes[:, 3], out_h))
    horizontal = axis_weights(left, box_w, x0, x1, out_w, width, dtype, taps(crops.boxes[:, 2], out_w), flips)
    resized_rows = torch.bmm(vertical, block).view(n, out_h * channels, width)  # [n, out_h, C * width]
    out = torch.bmm(resized_rows, horizontal.transpose(1, 2))  # [n, out_h * C, out_w]
    return out.view(n, out_h, channels, out_w).permute(0, 2, 1, 3).float()


def flat_windows(images: list[torch.Tensor], width: int) -> torch.Tensor:
    """The images concatenated into one flat buffer (then `width` zeros), viewed as its windows of `width`
    elements: row o is flat[o:o + width] (a view; nothing is copied but the concatenation)."""
    flat = torch.cat([*(image.reshape(-1) for image in images), images[0].new_zeros(width)])
    return flat.as_strided((flat.numel() - width + 1, width), (1, 1))


def host_params(crops: CropBatch, covered: np.ndarray) -> np.ndarray:
    """The kernel's per-image numbers as one float64 [n, 12] host array: box (4), covering pixels (4), decoded
    height and width, the image's offset in the flat buffer (3 planes each), flip."""
    n = len(crops.boxes)
    sizes = crops.shapes[:, 0] * crops.shapes[:, 1] * 3
    base = np.zeros(n, np.int64)
    np.cumsum(sizes[:-1], out=base[1:])
    return np.concatenate([crops.boxes, covered, crops.shapes, base[:, None], crops.flips[:, None]], axis=1,
                          dtype=np.float64)


def device_params(crops: CropBatch, covered: np.ndarray, device: torch.device) -> torch.Tensor:
    """`host_params` on `device`: through pinned memory and a non-blocking copy on CUDA (the host does not wait)."""
    host = torch.from_numpy(host_params(crops, covered))
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
