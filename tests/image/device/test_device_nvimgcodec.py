"""fastdata's nvImageCodec integration (fastdata.image.device.nvimgcodec) on the CPU, against a stand-in that
honours the library's documented API (tests/image/device/nvimgcodec_standin.py): options reach the library, crops are
decoded by region and give the whole-image decode's batches, and an image the library returns None for follows
the device path's rules. The real library is tested by the cuda-marked tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.image.device.auto import ENGINE_PROBE_KINDS, baseline_only, device_decoder, make_decoder
from fastdata.image.device.decoders import TorchvisionDecoder, decode_now
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.device.ship import pack_encoded
from fastdata.image.device.stage import DeviceStage
from tests.image.device import nvimgcodec_standin


@pytest.fixture
def standin(monkeypatch):
    nvimgcodec_standin.install(monkeypatch)
    from fastdata.image.device.nvimgcodec import NvImageCodecDecoder

    return NvImageCodecDecoder


@pytest.fixture(scope="module")
def packed(jpeg_photos):
    ds = fastdata.dataset(jpeg_photos[0], "train", image_size=48)
    return [pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(6 * b, 6 * b + 6)], 0) for b in range(2)]


def test_the_options_reach_the_library(standin):
    decoder = standin(torch.device("cpu"), DeviceDecodeOptions(backends=("hardware", "hybrid"), hardware_load=0.7,
                                                         cpu_threads=3))
    made = nvimgcodec_standin.Decoder.created[-1]
    assert made.max_num_cpu_threads == 3
    assert [(b.backend_kind.name, b.load_hint) for b in made.backends] == [("HW_GPU_ONLY", 0.7),
                                                                          ("HYBRID_CPU_GPU", 1.0)]
    assert decoder.regions and "hardware, hybrid" in decoder.name and "3 CPU threads" in decoder.name
    assert made.options == ":fancy_upsampling=0"  # nvImageCodec's own default, which options replace


def test_the_hardware_decoder_preallocates_as_dali_has_it(standin):
    """The loader's batch size and, where the dataset records its sizes, a typical image's: the options DALI passes
    nvImageCodec (nvjpeg_hw_decoder:preallocate_batch_size, width and height hints)."""
    from fastdata.image.device.auto import decoder_hints

    widths, heights = np.array([500] * 90 + [4000] * 10), np.array([375] * 90 + [3000] * 10)
    standin(torch.device("cpu"), DeviceDecodeOptions(), decoder_hints(256, widths, heights))
    options = nvimgcodec_standin.Decoder.created[-1].options.split()
    assert options[0] == ":fancy_upsampling=0"
    assert "nvjpeg_hw_decoder:preallocate_batch_size=256" in options
    hints = {o.split("=")[0]: int(o.split("=")[1]) for o in options if "hint" in o}
    assert 500 <= hints["nvjpeg_hw_decoder:preallocate_width_hint"] <= 4000
    assert 375 <= hints["nvjpeg_hw_decoder:preallocate_height_hint"] <= 3000


def test_region_decode_gives_the_whole_image_decodes_batch(standin, packed):
    """Each crop decoded by region (only its covering pixels) gives the batch that whole-image decoding gives."""
    library = standin(torch.device("cpu"), DeviceDecodeOptions(backends=("hybrid",)))
    by_region = DeviceStage("cpu", 48, "photos", decoder=library, regions=True)
    whole = DeviceStage("cpu", 48, "photos", decoder=TorchvisionDecoder(torch.device("cpu")))
    for batch in packed:
        got, expected = by_region(batch), whole(batch)
        assert torch.equal(got.labels, expected.labels)
        assert (got.images.int() - expected.images.int()).abs().max() <= 1  # Pillow vs torchvision's libjpeg
    assert nvimgcodec_standin.Decoder.created[-1].calls == [6, 6]  # one batched call per batch


def test_none_from_the_library_follows_the_device_paths_rules(standin, packed):
    """None for bytes the CPU decodes: decoded on the CPU, counted as rejected; None for bytes nothing decodes:
    on_error."""
    library = standin(torch.device("cpu"), DeviceDecodeOptions(backends=("hybrid",)))
    batch = packed[0]
    first = bytes(batch.data[batch.offsets[0]:batch.offsets[1]].numpy())
    nvimgcodec_standin.Decoder.created[-1].rejects = lambda data: data == first
    stage = DeviceStage("cpu", 48, "photos", decoder=library, on_error="skip")
    with pytest.warns(RuntimeWarning, match="could not decode sample"):
        made = stage(batch)
    assert len(made.images) == 6 and made.skipped == [] and stage.policy.rejected == 1
    assert stage.policy.errors == 0
    damaged = batch.data.clone()
    damaged[batch.offsets[1] + 300:batch.offsets[2]] = 0  # the second JPEG's scan wiped
    from dataclasses import replace

    broken = replace(batch, data=damaged)
    nvimgcodec_standin.Decoder.created[-1].rejects = lambda data: data == bytes(damaged[batch.offsets[1]:
                                                                                       batch.offsets[2]].numpy())
    with pytest.raises(CorruptSampleError, match=batch.keys[1]):
        DeviceStage("cpu", 48, "photos", decoder=library)(broken)


def test_nvimgcodec_is_for_cuda_devices():
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        make_decoder(torch.device("cpu"), DeviceDecodeOptions(decoder="nvimgcodec"))
    assert isinstance(make_decoder(torch.device("cpu"), DeviceDecodeOptions()), TorchvisionDecoder)
    with pytest.raises(ConfigError, match="backends"):
        DeviceDecodeOptions(backends=("fast",))


def test_a_jpeg_the_library_cannot_decode_by_region_is_decoded_whole_on_the_device(standin, packed):
    library = standin(torch.device("cpu"), DeviceDecodeOptions(backends=("hybrid",)))
    made_by = nvimgcodec_standin.Decoder.created[-1]
    original = made_by._one
    made_by._one = lambda src, params: None if src.region is not None and made_by.calls == [6] else original(
        src, params)
    stage = DeviceStage("cpu", 48, "photos", decoder=library, regions=True)
    with pytest.warns(RuntimeWarning, match="by region"):
        made = stage(packed[0])
    expected = DeviceStage("cpu", 48, "photos", decoder=TorchvisionDecoder(torch.device("cpu")))(packed[0])
    assert stage.policy.whole == 6 and stage.policy.rejected == 0 and made_by.calls[:2] == [6, 6]
    assert (made.images.int() - expected.images.int()).abs().max() <= 1


def test_decode_now_hands_the_buffers_back_for_the_next_call(standin, packed):
    """A caller done with each call's images (a probe, a decode-only benchmark) gets the decoder's buffers reused
    by its next call; plain `decode` calls without the feeder's hand-back never reuse them (they would pile up)."""
    batch = packed[0]
    payloads = [batch.data[batch.offsets[i]:batch.offsets[i + 1]].numpy() for i in range(len(batch))]
    library = standin(torch.device("cpu"), DeviceDecodeOptions())
    made = nvimgcodec_standin.Decoder.created[-1]
    first = decode_now(library, payloads)
    second = decode_now(library, payloads)
    assert made.given == [0, len(payloads)]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    plain = standin(torch.device("cpu"), DeviceDecodeOptions())
    for _ in range(3):
        plain.decode(payloads)
    assert nvimgcodec_standin.Decoder.created[-1].given == [0, 0, 0]
    assert decode_now(TorchvisionDecoder(torch.device("cpu")), payloads[:2])[0].shape[0] == 3  # no buffers: as decode


def test_auto_backends_take_the_engines_alone_where_the_decoder_gets_baseline_jpegs_only(standin, packed):
    """DeviceDecodeOptions(backends="auto"), the default: the hardware backend alone when the decoder is sent baseline
    JPEGs only and the engines decode the probes; its batches are the whole-image decode's."""
    cpu = torch.device("cpu")
    decoder = device_decoder(cpu, DeviceDecodeOptions(), baseline_only=True, make=standin)
    created = nvimgcodec_standin.Decoder.created
    assert decoder.backends == ("hardware",) and "(hardware;" in decoder.name
    assert [b.backend_kind.name for b in created[-1].backends] == ["HW_GPU_ONLY"]
    assert created[-1].calls == [len(ENGINE_PROBE_KINDS)]  # the probes, in one call
    expected = DeviceStage("cpu", 48, "photos", decoder=TorchvisionDecoder(cpu))(packed[0])
    got = DeviceStage("cpu", 48, "photos", decoder=decoder)(packed[0])
    assert (got.images.int() - expected.images.int()).abs().max() <= 1
    # progressive files may reach the decoder, or nothing is known: hardware + hybrid, no probe
    for options, only_baseline in ((DeviceDecodeOptions(), False), (DeviceDecodeOptions(backends=("hybrid",)), True)):
        before = len(created)
        chosen = device_decoder(cpu, options, baseline_only=only_baseline, make=standin)
        assert len(created) == before + 1 and created[-1].calls == []
        assert chosen.backends == (("hardware", "hybrid") if options.backends == "auto" else ("hybrid",))
    assert isinstance(device_decoder(cpu, DeviceDecodeOptions(), baseline_only=True),
                      TorchvisionDecoder)  # CPU: libjpeg


@pytest.mark.parametrize("no_engines, said", [("engines", "returned nothing for the 4:2:0"),
                                               ("refuse_engines_alone", "could not be made: RuntimeError")])
def test_auto_backends_keep_the_hybrid_decoder_on_a_gpu_whose_engines_fail_the_probe(standin, monkeypatch,
                                                                                     no_engines, said):
    """A GPU without JPEG engines: the library's decoder of the engines alone decodes nothing, or cannot be made."""
    monkeypatch.setattr(nvimgcodec_standin.Decoder, no_engines, no_engines == "refuse_engines_alone")
    with pytest.warns(RuntimeWarning, match=f"JPEG engines alone are not used.*{said}"):
        decoder = device_decoder(torch.device("cpu"), DeviceDecodeOptions(), baseline_only=True, make=standin)
    assert decoder.backends == ("hardware", "hybrid")
    assert [b.backend_kind.name for b in nvimgcodec_standin.Decoder.created[-1].backends] == ["HW_GPU_ONLY",
                                                                                             "HYBRID_CPU_GPU"]


def test_a_progressive_jpeg_refused_by_the_engines_alone_is_decoded_on_the_cpu_and_said(standin, tricky_lmdb):
    """A JPEG the engines alone refuse (here a progressive one, given them explicitly) is decoded on the CPU,
    counted, and the warning says how to give such files to the hybrid decoder."""
    from fastdata.image.jpeg.header import progressive

    ds = fastdata.dataset(tricky_lmdb, "val", image_size=16)
    rows = [i for i in range(len(ds)) if progressive(ds.encoded(i).data)]
    batch = pack_encoded(ds.pipeline, [ds.encoded(i) for i in rows], 0)
    assert not batch.worker_decoded.any()
    cpu = torch.device("cpu")
    engines = standin(cpu, DeviceDecodeOptions(backends=("hardware",)))
    stage = DeviceStage("cpu", 16, "tricky", decoder=engines)
    with pytest.warns(RuntimeWarning, match=r"could not decode sample.*backends=\('hardware', 'hybrid'\)"):
        made = stage(batch)
    expected = DeviceStage("cpu", 16, "tricky", decoder=TorchvisionDecoder(cpu))(batch)
    assert stage.policy.rejected == len(rows) and made.skipped == []
    assert (made.images.int() - expected.images.int()).abs().max() <= 1


@pytest.mark.region_extension
def test_the_decoder_gets_baseline_jpegs_only_when_the_conversion_recorded_no_progressive_one(
        tricky_tree, tricky_lmdb, tmp_path):
    """What `backends="auto"` goes by: the conversion's count of progressive JPEGs (the tricky tree has one; the
    baseline layout stores it baseline), or progressive="workers"; an older dataset records none: not known."""
    from fastdata.formats.manifest import read_manifest

    baseline = tmp_path / "baseline.lmdb"
    fastdata.convert_imagefolder(
        tricky_tree.root, baseline, fastdata.ImageFolderOptions(workers=1, progress=False, jpeg_layout="baseline")
    )
    original_kinds = read_manifest(tricky_lmdb).stats["gpu_kinds"]
    assert original_kinds["progressive"] == 1
    assert not baseline_only(DeviceDecodeOptions(), original_kinds)
    assert baseline_only(DeviceDecodeOptions(progressive="workers"), original_kinds)
    assert baseline_only(DeviceDecodeOptions(), read_manifest(baseline).stats["gpu_kinds"])
    assert not baseline_only(DeviceDecodeOptions(), None)
