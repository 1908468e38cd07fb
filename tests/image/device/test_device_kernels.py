"""The device path's batched crop-resize-flip (fastdata.image.device.kernels): torchvision's antialiased
`resized_crop` pixel for pixel, in a number of operations that does not grow with the batch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torchvision.transforms.v2 import functional as F

from fastdata.image.device import kernels
from fastdata.image.device.kernels import CropBatch, crop_resize_flip


def random_batch(n: int, seed: int, max_side: int = 300):
    rng = np.random.default_rng(seed)
    images, boxes, flips = [], [], []
    for i in range(n):
        height, width = (int(v) for v in rng.integers(20, max_side, 2))
        images.append(torch.from_numpy(rng.integers(0, 256, (3, height, width), dtype=np.uint8)))
        box_w, box_h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
        boxes.append((int(rng.integers(0, width - box_w + 1)), int(rng.integers(0, height - box_h + 1)), box_w, box_h))
        flips.append(bool(i % 2))
    shapes = np.array([image.shape[1:] for image in images])
    return images, CropBatch(np.array(boxes, np.float64), shapes, np.array(flips))


@pytest.mark.parametrize("size", [(224, 224), (64, 96), (17, 5)])
def test_batched_crop_resize_flip_is_torchvisions_antialiased_resized_crop(size):
    """Noise images (the hardest case: every pixel differs from its neighbours) of random sizes, random integer
    crops that shrink and enlarge, every other one flipped: within float rounding of torchvision."""
    images, crops = random_batch(12, seed=sum(size))
    out = crop_resize_flip(images, crops, size)
    assert out.shape == (12, 3, *size) and out.dtype == torch.float32
    for i, image in enumerate(images):
        left, top, width, height = (int(v) for v in crops.boxes[i])
        expected = F.resized_crop(image.float(), top, left, height, width, list(size), antialias=True)
        if crops.flips[i]:
            expected = expected.flip(-1)
        assert (out[i] - expected).abs().max() < 0.02, i


def test_fractional_boxes_sample_between_pixels():
    """A box shifted by half a pixel reads half of each neighbour (the "val" preset's boxes are fractional)."""
    image = torch.zeros((3, 4, 8), dtype=torch.uint8)
    image[:, :, 4:] = 200
    crops = CropBatch(np.array([[3.5, 0.0, 4.0, 4.0]]), np.array([[4, 8]]), np.array([False]))
    out = crop_resize_flip([image], crops, (4, 4))
    assert torch.allclose(out[0, 0, 0], torch.tensor([100.0, 200.0, 200.0, 200.0]))


class CountOps(TorchDispatchMode):
    """Counts the operations that compute (launch a kernel on a GPU): every op except views, which only make new
    tensor metadata (their schema returns an alias they do not write)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        returns = func._schema.returns
        if not any(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            self.ops += 1
        return func(*args, **(kwargs or {}))


def test_the_number_of_operations_does_not_grow_with_the_batch():
    """The same shrink factor, 4 images or 48: the same computing operations (a per-image loop would grow
    12-fold), and few of them."""
    counts = []
    for n in (4, 48):
        images = [torch.full((3, 120, 120), i, dtype=torch.uint8) for i in range(n)]
        crops = CropBatch(np.tile([[0.0, 0.0, 100.0, 100.0]], (n, 1)), np.tile([[120, 120]], (n, 1)),
                          np.arange(n) % 2 == 1)
        with CountOps() as counter:
            crop_resize_flip(images, crops, (50, 50))
        counts.append(counter.ops)
    assert counts[0] == counts[1] < 120, counts


def test_float16_products_stay_within_a_tenth_of_a_grey_level_of_float32():
    """CUDA's operands (float16, float32 sums) against the CPU's (float32), on noise: after rounding, no pixel
    moves by more than 1 and the mean moves by under 0.1 (docs/gpu.md states the figure)."""
    images, crops = random_batch(12, seed=5, max_side=500)
    exact = crop_resize_flip(images, crops, (224, 224), torch.float32).round()
    half = crop_resize_flip(images, crops, (224, 224), torch.float16).round()
    assert half.dtype == torch.float32
    difference = (exact - half).abs()
    assert difference.max() <= 1 and difference.mean() < 0.1, (difference.max(), difference.mean())


def test_a_batch_past_the_block_limit_is_resized_in_several_passes(monkeypatch):
    """Padded crops over MAX_BLOCK_BYTES: several passes, the same pixels as one pass."""
    images, crops = random_batch(10, seed=9)
    whole = crop_resize_flip(images, crops, (32, 32))
    covered = kernels.cover(crops.boxes, crops.shapes)
    monkeypatch.setattr(kernels, "MAX_BLOCK_BYTES", 3 * 300 * 300 * 4 * 2)
    runs = kernels._passes(covered, 3 * 4)
    assert len(runs) > 1 and runs[0][0] == 0 and runs[-1][1] == 10
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))
    assert torch.allclose(crop_resize_flip(images, crops, (32, 32)), whole, atol=1e-3)


class Shapes(TorchDispatchMode):
    """The output shapes of the operations that compute (not views, not allocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        computes = not any(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        if computes and "empty" not in func.__name__ and isinstance(out, torch.Tensor):
            self.shapes.append(tuple(out.shape))
        return out


def test_the_dense_weight_matrices_are_written_in_three_passes():
    """Each axis's [n, out, extent] weights: one fused |p - c| / r, one clamp, one fused scale-and-cast; the rest of
    the arithmetic runs on [n, out], [n, extent] or [n, out, taps] tensors (the kernel before it made ~8 passes
    over the dense matrices, each reading and writing all of it)."""
    images, crops = random_batch(8, seed=4)
    covered = kernels.cover(crops.boxes, crops.shapes)
    height, width = int((covered[:, 3] - covered[:, 1]).max()), int((covered[:, 2] - covered[:, 0]).max())
    with Shapes() as seen:
        crop_resize_flip(images, crops, (50, 40))
    assert seen.shapes.count((8, 50, height)) == 3 and seen.shapes.count((8, 40, width)) == 3, seen.shapes
