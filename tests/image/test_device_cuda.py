"""decode="device" on a real GPU (cuda-marked: they run where one is present): no host synchronisation in a
steady-state pass, the pixels of each decoder against the CPU path within their stated tolerance, real
out-of-memory errors, damaged bytes through the real decoders, and nvImageCodec's options."""

from __future__ import annotations

import pytest
import torch

import fastdata
from fastdata.errors import DeviceDecodeError
from fastdata.image.device.decoders import TorchvisionDecoder, nvimgcodec_missing
from fastdata.image.device.options import DeviceDecode
from fastdata.image.device.ship import pack_encoded
from fastdata.image.device.stage import DeviceStage

pytestmark = pytest.mark.cuda

#: Mean absolute difference (grey levels) from the CPU path's batches (libjpeg + the same batched resize), per
#: decoder: what docs/gpu.md states.
TOLERANCE = {"torchvision": 1.5, "nvimgcodec": 1.0}




def decoders() -> list[str]:
    return ["torchvision"] + ([] if nvimgcodec_missing() else ["nvimgcodec"])


@pytest.mark.parametrize("decode_ahead", [False, True])
@pytest.mark.parametrize("decoder", decoders())
def test_a_steady_pass_never_synchronises_the_host(photos, decoder, decode_ahead):
    loader = fastdata.loader(photos[0], batch_size=8, image_size=64, num_workers=2, device="cuda",
                             decode=DeviceDecode(decoder=decoder, decode_ahead=decode_ahead), dtype=torch.bfloat16,
                             channels_last=True, drop_last=True)
    for _ in loader:  # warm-up: the decoder, the slots, cuDNN-free allocations
        pass
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        count = 0
        for images, labels in loader:  # the feeder thread raises on a synchronising call, and it reaches here
            (images.float().mean() + labels.float().mean()).add_(1)
            count += 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert count == len(loader)
    assert images.is_cuda and images.dtype == torch.bfloat16 and images.is_contiguous(
        memory_format=torch.channels_last)
    loader.close_feeder()


@pytest.mark.parametrize("decoder", decoders())
@pytest.mark.parametrize("augment, decode_ahead", [("train", False), ("val", False), ("train", True)])
def test_cuda_batches_match_the_cpu_paths(photos, decoder, augment, decode_ahead):
    options = dict(batch_size=8, image_size=224, num_workers=0, seed=3, shuffle=False, augment=augment)
    cpu = list(fastdata.loader(photos[0], decode="device", device="cpu", **options))
    loader = fastdata.loader(photos[0], decode=DeviceDecode(decoder=decoder, decode_ahead=decode_ahead),
                             device="cuda", **options)
    gpu = list(loader)
    assert decoder.split()[0] in loader.device_decoder
    for (ci, cl), (gi, gl) in zip(cpu, gpu, strict=True):
        assert gi.device.type == "cuda" and torch.equal(cl, gl.cpu())
        assert (ci.int() - gi.cpu().int()).abs().float().mean() < TOLERANCE[decoder]
    assert loader.device_errors == 0 and loader.device_fallbacks > 0  # the PNGs, decoded in the workers
    loader.close_feeder()


def test_cuda_out_of_memory_raises_naming_the_batch(photos):
    class OutOfMemory(TorchvisionDecoder):
        def decode(self, payloads, regions=None):
            torch.empty(1 << 50, dtype=torch.uint8, device=self.device)  # a real CUDA out-of-memory error
            return super().decode(payloads, regions)

    ds = fastdata.dataset(photos[0], "val", image_size=32)
    packed = pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(8)], 0)
    with pytest.raises(DeviceDecodeError, match="ran out of memory") as caught:
        DeviceStage("cuda", 32, "photos", decoder=OutOfMemory(torch.device("cuda")))(packed)
    assert packed.keys[0] in str(caught.value)


@pytest.mark.parametrize("decoder", decoders())
def test_damaged_jpegs_on_the_gpu_follow_on_error(photos, decoder):
    ds = fastdata.dataset(photos[0], "train", image_size=32)
    samples = [ds.encoded(i) for i in range(8)]
    victim = next(s for s in samples if s.codec == 0)
    victim.data = victim.data[:victim.data.index(b"\xff\xda") + 30]  # truncated: the worker's decoder reports it
    packed = pack_encoded(ds.pipeline, samples, 0, on_error="skip")
    from fastdata.image.device.auto import make_decoder

    stage = DeviceStage("cuda", 32, "photos", decoder=make_decoder(torch.device("cuda"), DeviceDecode(decoder=decoder)),
                        on_error="skip")
    made = stage(packed)
    assert [key for key, _ in made.skipped + packed.skipped] == [victim.key] and len(made.images) == 7
    assert stage.policy.errors == 0


def test_cuda_resize_in_float16_stays_within_a_tenth_of_a_grey_level_of_the_cpus():
    """The batched crop-resize-flip on CUDA (float16 products, cuBLAS) against the same batch on the CPU
    (float32): what docs/gpu.md states (rounded pixels: at most 1 apart, under 0.1 on average)."""
    import numpy as np

    from fastdata.image.device.kernels import CropBatch, compute_dtype, crop_resize_flip

    assert compute_dtype(torch.device("cuda")) == torch.float16
    rng = np.random.default_rng(0)
    images, boxes = [], []
    for _ in range(16):
        height, width = (int(v) for v in rng.integers(100, 500, 2))
        images.append(torch.from_numpy(rng.integers(0, 256, (3, height, width), dtype=np.uint8)))
        box_w, box_h = int(rng.integers(10, width)), int(rng.integers(10, height))
        boxes.append((float(rng.integers(0, width - box_w)), float(rng.integers(0, height - box_h)), box_w, box_h))
    crops = CropBatch(np.array(boxes), np.array([i.shape[1:] for i in images]), np.arange(16) % 2 == 0)
    cpu = crop_resize_flip(images, crops, (224, 224)).round()
    gpu = crop_resize_flip([i.cuda() for i in images], crops, (224, 224)).round().cpu()
    difference = (cpu - gpu).abs()
    assert difference.max() <= 1 and difference.mean() < 0.1, (difference.max(), difference.mean())


@pytest.mark.skipif(bool(nvimgcodec_missing()), reason="needs nvImageCodec: pip install 'fastdata[gpu-cu13]'")
def test_auto_backends_on_this_gpu_decode_baseline_jpegs_with_the_engines_or_say_why_not(photos):
    """DeviceDecode(backends="auto") with progressive JPEGs kept in the workers: the decoder is sent baseline JPEGs
    only, so it is the JPEG engines alone where this GPU's engines decode the probes (else hardware + hybrid, said
    once); either way the batches stay within nvImageCodec's tolerance of the CPU's and nothing is refused."""
    import warnings

    options = dict(batch_size=8, image_size=224, num_workers=0, seed=3, shuffle=False, augment="val",
                   decode=DeviceDecode(progressive="workers"))
    cpu = list(fastdata.loader(photos[0], device="cpu", **options))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastdata.loader(photos[0], device="cuda", **options)
        gpu = list(loader)
    said = [str(w.message) for w in caught if "JPEG engines alone are not used" in str(w.message)]
    assert ("(hardware;" in loader.device_decoder) != bool(said), (loader.device_decoder, said)
    for (ci, cl), (gi, gl) in zip(cpu, gpu, strict=True):
        assert torch.equal(cl, gl.cpu())
        assert (ci.int() - gi.cpu().int()).abs().float().mean() < TOLERANCE["nvimgcodec"]
    assert loader.device_rejected == 0 and loader.device_errors == 0
    loader.close_feeder()
