"""decode="device" on a real GPU (cuda-marked: they run where one is present): no host synchronisation in a
steady-state pass, no CUDA before the workers fork, 0 wrong labels and 0 corrupted batches in 200 with the training
stream delayed (`torch.cuda._sleep`), the pixels of each decoder against the CPU path within their stated
tolerance, real out-of-memory errors, damaged bytes through the real decoders, and nvImageCodec's options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastdata
from fastdata.errors import DeviceDecodeError
from fastdata.image.device.decoders import TorchvisionDecoder, nvimgcodec_missing
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.device.ship import pack_encoded
from fastdata.image.device.stage import DeviceStage

pytestmark = pytest.mark.cuda

#: Mean absolute difference (grey levels) from the CPU path's batches (libjpeg + the same batched resize), per
#: decoder: what docs/gpu.md states.
TOLERANCE = {"torchvision": 1.5, "nvimgcodec": 1.0}




def decoders() -> list[str]:
    return ["torchvision"] + ([] if nvimgcodec_missing() else ["nvimgcodec"])


@pytest.mark.parametrize("decoder", decoders())
def test_a_steady_pass_never_synchronises_the_host(photos, decoder):
    loader = fastdata.loader(photos[0], batch_size=8, image_size=64, num_workers=2, device="cuda",
                             decode=DeviceDecodeOptions(decoder=decoder), drop_last=True,
                             output=fastdata.OutputOptions(dtype=torch.bfloat16, channels_last=True))
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
@pytest.mark.parametrize("augment", ["train", "val"])
def test_cuda_batches_match_the_cpu_paths(photos, decoder, augment):
    options = dict(batch_size=8, image_size=224, num_workers=0, seed=3, shuffle=False, augment=augment)
    cpu = list(fastdata.loader(photos[0], decode="device", device="cpu", **options))
    loader = fastdata.loader(photos[0], decode=DeviceDecodeOptions(decoder=decoder), device="cuda", **options)
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

    stage = DeviceStage("cuda", 32, "photos",
                        decoder=make_decoder(torch.device("cuda"), DeviceDecodeOptions(decoder=decoder)),
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
    """DeviceDecodeOptions(backends="auto") with progressive JPEGs kept in the workers: the decoder is sent baseline
    JPEGs only, so it is the JPEG engines alone where this GPU's engines decode the probes (else hardware + hybrid, said
    once); either way the batches stay within nvImageCodec's tolerance of the CPU's and nothing is refused."""
    import warnings

    options = dict(batch_size=8, image_size=224, num_workers=0, seed=3, shuffle=False, augment="val",
                   decode=DeviceDecodeOptions(progressive="workers"))
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


@pytest.fixture(scope="module")
def id_jpegs(tmp_path_factory):
    """48 JPEGs (4:4:4, quality 100) whose green channel is the sample id x GREEN_STEP, in the solid tree's classes
    (label = id % 3): every crop of one is flat green, so a batch says which samples it holds."""
    from builders.images import SOLID_CLASSES, encode, solid_label, solid_pattern

    root = tmp_path_factory.mktemp("id_jpegs")
    rng = np.random.default_rng(7)
    for i in range(48):
        width, height = (int(v) * 2 + 1 for v in rng.integers(20, 60, 2))
        path = root / "src" / SOLID_CLASSES[solid_label(i)] / f"s{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode(solid_pattern(i, width, height), "JPEG", quality=100, subsampling=0))
    fastdata.convert_imagefolder(
        root / "src", root / "ids.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
    )
    return root / "ids.lmdb"


@pytest.mark.parametrize("decoder", decoders())
def test_with_the_training_stream_delayed_no_label_is_wrong_and_no_batch_corrupted_in_200(id_jpegs, decoder):
    """Each step first holds the training stream (`torch.cuda._sleep`), so the feeder's threads run far ahead of
    the GPU's reading of each batch: the labels must still be the samples' own (their label is id % 3, the id read
    from the pixels), every image one sample's flat green, and every batch equal to a run that synchronised after
    each step (decoded buffers and slots reused only once read). Checked on the GPU, read back at the end."""
    from builders.images import GREEN_STEP, SOLID_CLASSES

    options = dict(batch_size=8, image_size=32, augment="val", num_workers=2, device="cuda", seed=1,
                   drop_last=True, decode=DeviceDecodeOptions(decoder=decoder))

    def batches(delay: bool):
        loader = fastdata.loader(id_jpegs, **options)
        kept, wrong_labels, mixed = [], torch.zeros((), dtype=torch.int64, device="cuda"), torch.zeros(
            (), dtype=torch.int64, device="cuda")
        while len(kept) < 200:
            for images, labels in loader:
                if delay:
                    torch.cuda._sleep(20_000_000)  # tens of milliseconds of the training stream
                green = images[:, 1].flatten(1).float()
                ids = (green.median(dim=1).values / GREEN_STEP).round().long()
                wrong_labels += (labels != ids % len(SOLID_CLASSES)).sum()
                mixed += ((green.amax(dim=1) - green.amin(dim=1)) > 8).sum()
                kept.append((images.clone(), labels.clone()))
                if not delay:
                    torch.cuda.synchronize()
                if len(kept) == 200:
                    break
        loader.close()
        torch.cuda.synchronize()
        return kept, int(wrong_labels), int(mixed)

    reference, ref_wrong, ref_mixed = batches(delay=False)
    delayed, wrong, mixed = batches(delay=True)
    assert (ref_wrong, ref_mixed) == (0, 0)
    assert wrong == 0 and mixed == 0, (wrong, mixed)
    corrupted = sum(not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
                    for a, b in zip(delayed, reference, strict=True))
    assert corrupted == 0


def test_nothing_starts_cuda_before_the_workers_fork(photos, tmp_path):
    """In a fresh process: making a device-path loader for the GPU leaves CUDA uninitialised (only the device count
    is asked); its first pass forks the workers, then starts CUDA on the feeder's threads."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "fork_first.py"
    script.write_text(textwrap.dedent(f"""
        import torch, fastdata
        loader = fastdata.loader({str(photos[0])!r}, batch_size=8, image_size=32, num_workers=2, decode="device",
                                 device="cuda")
        assert not torch.cuda.is_initialized(), "CUDA started before the workers forked"
        assert sum(1 for _ in loader) == len(loader)
        assert torch.cuda.is_initialized()
        loader.close()
        print("ok")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_fused_weights_kernel_gives_the_unfused_weights():
    """The resize weights' one fused CUDA kernel (jiterator) against the same formula in separate passes."""
    from fastdata.image.device import kernels

    assert kernels._fused_weights() is not None, "the fused kernel could not be compiled here"
    rng = np.random.default_rng(1)
    pixels = torch.from_numpy(rng.uniform(0, 300, (16, 400))).float().cuda()
    pixels[:, 350:] = kernels._FAR
    centres = torch.from_numpy(rng.uniform(0, 300, (16, 224))).float().cuda()
    inverse = torch.from_numpy(rng.uniform(0.1, 1, (16, 224, 1))).float().cuda()
    fused = kernels._fused_weights()(pixels[:, None, :], centres[:, :, None], inverse)
    unfused = (1 - (pixels[:, None, :] - centres[:, :, None]).abs()).clamp(min=0) * inverse
    assert torch.allclose(fused, unfused, atol=1e-6)
