"""The device path's batched crop-resize-flip: matrix products (today's kernel) against per-tap gathers (the kernel
before it, kept here as the baseline), on the same decoded photos and the same train crops.

    python -m benchmarks.resize_kernel [--images 3000] [--batch-size 256] [--batches 4] [--repeats 3]
                                       [--device cpu|cuda]

The sample photos are decoded once with Pillow into CHW uint8 tensors on the device; each gets a
RandomResizedCrop 224 + flip from fastdata's train preset (seeded). Each contender resizes the same `--batches`
batches per run, contenders alternating over `--repeats` runs; medians, spread (max - min), and the ratio as the
median of per-run ratios against the gather kernel. On CUDA the time is the GPU's (CUDA events around the batches,
after a warm-up), which is what the training step loses when the feeder's kernels share the GPU with it; on the CPU
it is wall time. Also the pixels: each contender's rounded output against the gather kernel's (mean and max
absolute difference, grey levels), and the float16 products against float32 ones.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder
from fastdata.image.augment import make_preset
from fastdata.image.device.kernels import CropBatch, cover, crop_resize_flip, device_params, flat_windows
from fastdata.order.epoch import sample_rng
from fastdata.tools.bench_fair import alternate, median_ratio

SIZE = (224, 224)


def taps_needed(boxes: np.ndarray, size: tuple[int, int]) -> int:
    """K, the taps per output pixel for the batch's largest shrink (Pillow's kernel size for a triangle of radius
    max(shrink, 1): 2 * ceil(radius) + 1)."""
    if not len(boxes):
        return 1
    shrink = max(float((boxes[:, 3] / size[0]).max()), float((boxes[:, 2] / size[1]).max()), 1.0)
    return 2 * math.ceil(shrink) + 1


def _axis_taps(start: torch.Tensor, length: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out: int, k: int,
               flip: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Source indices and weights [n, out, k] along one axis: output pixel i of image b samples the box
    [start, start + length) at centre start + (i + 0.5) * scale (mirrored when `flip`), with a triangle of radius
    max(scale, 1), over the pixels [lo, hi) only (the crop's covering pixels), weights summing to 1 (Pillow's
    arithmetic: first tap int(centre - radius + 0.5), weight of pixel x tri((x + 0.5 - centre) / radius))."""
    device = start.device
    scale = (length / out)[:, None, None]  # [n, 1, 1]
    radius = scale.clamp(min=1.0)
    i = torch.arange(out, device=device, dtype=torch.float64)[None, :, None]  # [1, out, 1]
    if flip is not None:
        i = torch.where(flip[:, None, None], out - 1 - i, i)
    centre = start[:, None, None] + (i + 0.5) * scale
    first = torch.floor(centre - radius + 0.5).clamp(min=lo[:, None, None].double())
    index = first + torch.arange(k, device=device, dtype=torch.float64)[None, None, :]  # [n, out, k]
    weight = (1 - ((index + 0.5 - centre) / radius).abs()).clamp(min=0.0)
    weight = torch.where(index < hi[:, None, None].double(), weight, torch.zeros((), dtype=weight.dtype,
                                                                                 device=device))
    weight = weight / weight.sum(-1, keepdim=True).clamp(min=1e-12)
    index = torch.minimum(index, hi[:, None, None].double() - 1)  # taps past the end: weight 0, any valid index
    return index.long(), weight.float()


def gather_kernel(images: list[torch.Tensor], crops: CropBatch, size: tuple[int, int]) -> torch.Tensor:
    """The kernel before the matrix products (fastdata at d97416f): for each of K taps, gather every output row's
    source row from the flat buffer (a window as wide as the widest crop) and add it with its weight; then the same
    along the columns. 2K gathers and 2K multiply-adds over [n, C, out_h, window] float32 buffers."""
    n = len(images)
    out_h, out_w = size
    device = images[0].device
    channels = images[0].shape[0]
    covered = cover(crops.boxes, crops.shapes)
    window = int((covered[:, 2] - covered[:, 0]).max())
    k = taps_needed(crops.boxes, size)
    left, top, width, height, x0, y0, x1, y1, image_h, image_w, base, flip = device_params(crops, covered,
                                                                                          device).unbind(1)
    flips = flip > 0.5
    windows = flat_windows(images, window)
    rows, row_weights = _axis_taps(top, height, y0, y1, out_h, k)
    plane = (image_h * image_w)[:, None, None, None]
    channel = torch.arange(channels, device=device, dtype=torch.float64)[None, :, None, None]
    starts = (base[:, None, None, None] + channel * plane + rows[:, None].double() * image_w[:, None, None, None]
              + x0[:, None, None, None]).long()
    vertical = torch.zeros((n, channels, out_h, window), dtype=torch.float32, device=device)
    for tap in range(k):
        gathered = windows.index_select(0, starts[..., tap].reshape(-1)).view(n, channels, out_h, window)
        vertical.addcmul_(gathered, row_weights[:, None, :, tap, None])
    columns, column_weights = _axis_taps(left, width, x0, x1, out_w, k, flips)
    columns = columns - x0.long()[:, None, None]
    vertical = vertical.view(n, channels * out_h, window)
    out = torch.zeros((n, channels * out_h, out_w), dtype=torch.float32, device=device)
    for tap in range(k):
        index = columns[:, None, :, tap].expand(n, channels * out_h, out_w)
        out.addcmul_(vertical.gather(2, index), column_weights[:, None, :, tap])
    return out.view(n, channels, out_h, out_w)


def photo_batches(data: Path, images: int, batch: int, batches: int, device: torch.device
                  ) -> list[tuple[list[torch.Tensor], CropBatch]]:
    """`batches` batches of decoded sample photos on `device`, each image with its train crop and flip."""
    from PIL import Image

    files = sorted(p for p in cached_sample_imagefolder(data, images).rglob("*") if p.is_file())
    needed = batch * batches
    if len(files) < needed:
        raise SystemExit(f"{len(files)} photos, {needed} needed: raise --images or lower --batches/--batch-size")
    preset = make_preset("train", SIZE)
    made = []
    for first in range(0, needed, batch):
        tensors, boxes, flips = [], [], []
        for i in range(first, first + batch):
            with Image.open(files[i]) as image:
                array = np.asarray(image.convert("RGB"))
            tensors.append(torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1))).to(device))
            params = preset.params(array.shape[1], array.shape[0], sample_rng(0, 0, i))
            boxes.append((params.left, params.top, params.width, params.height))
            flips.append(params.flip)
        shapes = np.array([t.shape[1:] for t in tensors], np.int64)
        made.append((tensors, CropBatch(np.array(boxes, np.float64), shapes, np.array(flips))))
    return made


def timed(kernel: Callable[[list[torch.Tensor], CropBatch], torch.Tensor],
          batches: list[tuple[list[torch.Tensor], CropBatch]], cuda: bool) -> float:
    """Milliseconds per batch: the GPU's (events) on CUDA, wall time on the CPU."""
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for images, crops in batches:
            kernel(images, crops)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / len(batches)
    started = time.perf_counter()
    for images, crops in batches:
        kernel(images, crops)
    return 1000 * (time.perf_counter() - started) / len(batches)


def kernels(device: torch.device) -> dict[str, Callable[[list[torch.Tensor], CropBatch], torch.Tensor]]:
    made = {"gathers per tap, float32 (the kernel before)": lambda i, c: gather_kernel(i, c, SIZE),
            "matrix products, float32": lambda i, c: crop_resize_flip(i, c, SIZE, torch.float32)}
    if device.type == "cuda":
        made["matrix products, float16 (the CUDA default)"] = lambda i, c: crop_resize_flip(i, c, SIZE,
                                                                                             torch.float16)
    return made


def pixel_differences(contenders: dict, batches: list) -> dict[str, tuple[float, float]]:
    """(mean, max) absolute difference of each contender's rounded pixels from the first contender's."""
    images, crops = batches[0]
    outputs = {name: kernel(images, crops).round().clamp(0, 255) for name, kernel in contenders.items()}
    reference = next(iter(outputs.values()))
    return {name: (float((out - reference).abs().mean()), float((out - reference).abs().max()))
            for name, out in outputs.items()}


def measure(data: Path, images: int, batch: int, batches: int, repeats: int, device: torch.device) -> dict:
    """Time every kernel over the same batches (alternating), print the table; returns ms per batch by kernel."""
    cuda = device.type == "cuda"
    photos = photo_batches(data, images, batch, batches, device)
    contenders = kernels(device)
    for kernel in contenders.values():  # warm-up (CUDA: kernels loaded, allocator primed)
        timed(kernel, photos[:1], cuda)
    ms: dict[str, list[float]] = {name: [] for name in contenders}
    alternate(list(contenders), repeats, lambda name, _: ms[name].append(timed(contenders[name], photos, cuda)))
    pixels = pixel_differences(contenders, photos)
    baseline = ms[next(iter(contenders))]
    where = torch.cuda.get_device_name(device) + " (GPU time)" if cuda else "CPU, 2 threads (wall time)"
    rows = [[name, f"{statistics.median(v):.2f}", f"{max(v) - min(v):.2f}",
             f"{batch * 1000 / statistics.median(v):,.0f}", f"x{median_ratio(baseline, v):.2f}",
             f"{pixels[name][0]:.3f} / {pixels[name][1]:.0f}"] for name, v in ms.items()]
    report.table(f"the device path's crop-resize-flip on {where}: {batch} sample photos per batch, train crops to "
                 f"{SIZE[0]}x{SIZE[1]}, {batches} batches per run, {repeats} alternating runs",
                 ["kernel", "ms per batch (median)", "spread", "img/s", "speed-up", "pixels vs gathers (mean / max)"],
                 rows, align="lrrrrr")
    return {"ms_per_batch": ms, "pixels": pixels}


def main() -> None:
    parser = arguments(__doc__.split("\n")[0], images=3000, repeats=3, batch_size=256, batches=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda":
        torch.set_num_threads(2)  # the machine the CPU figures are quoted for
    measure(args.data, args.images, args.batch_size, args.batches, args.repeats, device)


if __name__ == "__main__":
    main()
