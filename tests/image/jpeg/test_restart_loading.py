"""Loading a restart-layout dataset (issue 21): a rewritten JPEG's crop is decoded from the sub-JPEG of the MCUs it
covers, and the batches are bit for bit those of the original-layout dataset of the same source JPEGs (train and
val presets, LMDB and WebDataset, several seeds, several DCT scales); a library that fails the restart self-check
falls back to the whole file's region decode, warned once."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastdata
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image import pipeline as pipeline_module
from tests.builders.images import build_sampling_tree
from tests.builders.runs import seeded_loader

pytestmark = pytest.mark.region_extension


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("restart_loading")
    tree = build_sampling_tree(root / "src")
    made = {}
    for layout in ("original", "restart"):
        made["lmdb", layout] = root / f"{layout}.lmdb"
        made["wds", layout] = root / f"{layout}-shards"
        fastdata.convert_imagefolder(
            tree.root, made["lmdb", layout], fastdata.ImageFolderOptions(workers=1, progress=False, jpeg_layout=layout)
        )
        fastdata.convert_imagefolder(
            tree.root,
            made["wds", layout],
            fastdata.ImageFolderOptions(
                format="wds", shard_size="64KB", seed=2, workers=1, progress=False, jpeg_layout=layout
            ),
        )
    return made


def batches(path, epochs: int = 2, **options) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every batch of `epochs` passes (each epoch crops anew)."""
    loader = seeded_loader(path, batch_size=4, **options)
    return [(images.cpu().numpy().copy(), labels.cpu().numpy().copy()) for _ in range(epochs)
            for images, labels in loader]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("augment, image_size", [("train", 48), ("train", 160), ("val", 64)])
def test_restart_layout_batches_equal_the_original_layouts(datasets, fmt, augment, image_size):
    for seed in (0, 1, 5):
        expected = batches(datasets[fmt, "original"], augment=augment, image_size=image_size, seed=seed)
        got = batches(datasets[fmt, "restart"], augment=augment, image_size=image_size, seed=seed)
        assert len(got) == len(expected) == 6
        assert not np.array_equal(got[0][0], got[3][0])  # the second epoch's crops are other ones
        for number, ((images, labels), (want_images, want_labels)) in enumerate(zip(got, expected, strict=True)):
            assert np.array_equal(labels, want_labels)
            assert np.array_equal(images, want_images), (fmt, augment, seed, number)


def test_rewritten_jpegs_are_decoded_from_their_sub_jpegs(datasets):
    ds = fastdata.dataset(datasets["lmdb", "restart"], augment="train", image_size=48)
    decoder = ds.pipeline.region_decoder_for_presets()
    assert ds.pipeline.jpeg_layout == "restart"
    indexed = {}
    for i in range(len(ds)):
        sample = ds.encoded(i)
        indexed[sample.key] = ds.pipeline._restart_index(decoder, sample) is not None
    assert indexed == {key: not key.endswith((".png", "ink.jpg")) for key in indexed}  # CMYK: not a JPEG record
    original = fastdata.dataset(datasets["lmdb", "original"], augment="train", image_size=48)
    assert original.pipeline.jpeg_layout == "original"
    sample = original.encoded(0)
    assert sample.codec == CODEC_CV_JPEG and original.pipeline._restart_index(decoder, sample) is None


def test_a_library_failing_the_restart_self_check_falls_back_with_one_warning(datasets, monkeypatch):
    monkeypatch.setattr(pipeline_module, "restart_failure", lambda decoder: "the 4:2:0 probe differs")
    expected = batches(datasets["lmdb", "original"], augment="train", seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = batches(datasets["lmdb", "restart"], augment="train", seed=3)
    said = [w for w in caught if "restart self-check" in str(w.message)]
    assert len(said) == 1 and "the 4:2:0 probe differs" in str(said[0].message)
    for (images, _), (want, _) in zip(got, expected, strict=True):
        assert np.array_equal(images, want)


@pytest.mark.parametrize("first", ["original", "restart"])
def test_a_mixture_with_a_restart_source_gives_the_original_layouts_batches(datasets, first):
    second = "restart" if first == "original" else "original"
    mixture = [datasets["lmdb", first], datasets["lmdb", second]]
    loader = seeded_loader(mixture, weights=[1, 1], batch_size=4, image_size=48, seed=4)
    assert loader.dataset.pipeline.jpeg_layout == "restart"
    expected = batches([datasets["lmdb", "original"]] * 2, weights=[1, 1], image_size=48, seed=4)
    got = batches(mixture, weights=[1, 1], image_size=48, seed=4)
    assert len(got) == len(expected)
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        assert np.array_equal(labels, want_labels) and np.array_equal(images, want_images)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("augment, image_size", [("train", 48), ("val", 64)])
def test_device_decode_of_sub_jpegs_gives_the_original_layouts_batches(datasets, fmt, augment, image_size):
    """decode="device" (device="cpu": torchvision's decode_jpeg, the same code path as nvjpeg's) over the restart
    layout ships each crop's sub-JPEG, and the batches equal the original layout's, decoded on the device too."""
    for seed in (0, 3):
        options = dict(augment=augment, image_size=image_size, seed=seed, device="cpu", decode="device")
        expected = batches(datasets[fmt, "original"], **options)
        got = batches(datasets[fmt, "restart"], **options)
        assert len(got) == len(expected) == 6
        proved = seeded_loader(datasets[fmt, "restart"], batch_size=4, **options)
        list(proved)
        assert proved.dataset.pipeline.config.sub_jpegs  # the feeder's probe passed: the workers ship sub-JPEGs
        for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
            assert np.array_equal(labels, want_labels)
            assert np.array_equal(images, want_images), (fmt, augment, seed)


def test_the_device_gets_the_crops_sub_jpeg_not_the_whole_file(datasets):
    """The bytes a worker ships for the device: a train crop's sub-JPEG holds fewer bytes than the file."""
    from fastdata.image.device.ship import SubJpegSwitch, pack_encoded
    from fastdata.image.pipeline import PipelineConfig

    shipped = {}
    for layout in ("original", "restart"):
        ds = fastdata.dataset(datasets["lmdb", layout], augment="train", image_size=48)
        switch = SubJpegSwitch()
        ds.pipeline.configure(PipelineConfig(ship_encoded=True, sub_jpegs=switch))
        switch.enable()
        samples = [ds.encoded(i) for i in range(len(ds))]
        batch = pack_encoded(ds.pipeline, samples, 0)
        taken = ~batch.worker_decoded.numpy()
        shipped[layout] = (int(batch.offsets[-1]), int(taken.sum()))
    assert shipped["restart"][1] == shipped["original"][1] > 0
    assert shipped["restart"][0] < 0.9 * shipped["original"][0], shipped


def test_a_device_decoder_that_differs_on_sub_jpegs_gets_whole_files():
    """The probe check passes torchvision's decoder on the CPU and refuses one whose sub-JPEG pixels are not the
    rewritten whole file's (here: one that blanks each image's last column, which a sub-JPEG has elsewhere), for
    every sampling kind it probes."""
    import torch

    from fastdata.image.device.auto import DEVICE_PROBE_KINDS, sub_jpeg_failure
    from fastdata.image.device.decoders import TorchvisionDecoder

    class BlanksLastColumn(TorchvisionDecoder):
        def decode(self, payloads, regions=None):
            images = [image.clone() for image in super().decode(payloads, regions)]
            for image in images:
                image[:, :, -1] = 0
            return images

    assert set(DEVICE_PROBE_KINDS) >= {"4:2:0", "4:2:2", "4:4:4", "4:4:0", "grey"}
    assert sub_jpeg_failure(TorchvisionDecoder(torch.device("cpu"))) == ""
    assert "decodes to other pixels than the whole rewritten file" in sub_jpeg_failure(
        BlanksLastColumn(torch.device("cpu")))


@pytest.mark.cuda
@pytest.mark.parametrize("decoder", ["auto", "torchvision"])
def test_device_sub_jpegs_give_the_rewritten_whole_files_batches(datasets, decoder):
    """On CUDA, the contract the loader relies on: over the restart layout, the crops' sub-JPEGs give exactly the
    batches the rewritten whole files give on the same decoder (if the decoder fails the probe check, whole files
    go, with a warning: the same batches again)."""
    options = dict(augment="train", image_size=48, device="cuda")
    whole = batches(datasets["lmdb", "restart"], decode=fastdata.DeviceDecodeOptions(decoder=decoder, sub_jpegs=False),
                    **options)
    subs = batches(datasets["lmdb", "restart"], decode=fastdata.DeviceDecodeOptions(decoder=decoder), **options)
    assert len(subs) == len(whole) == 6
    for (images, labels), (want_images, want_labels) in zip(subs, whole, strict=True):
        assert np.array_equal(labels, want_labels) and np.array_equal(images, want_images)


def test_a_kind_the_decoder_takes_neither_whole_nor_cut_leaves_the_sub_jpegs_on():
    """A decoder that returns nothing for one sampling kind (the JPEG engines alone may refuse 4:4:0), whole file
    and sub-JPEGs alike, still gets sub-JPEGs: such files go to the CPU either way. One that refuses only the
    sub-JPEGs of a kind does not."""
    import torch

    from fastdata.image.device.auto import sub_jpeg_failure
    from fastdata.image.device.decoders import TorchvisionDecoder
    from fastdata.image.jpeg.header import read_frame

    def is_440(payload) -> bool:
        frame = read_frame(bytes(payload))
        return frame is not None and frame.sampling[0] == (1, 2) and len(frame.sampling) == 3

    class Refuses(TorchvisionDecoder):
        def __init__(self, device, refused):
            super().__init__(device)
            self.refused = refused

        def decode(self, payloads, regions=None):
            return [None if self.refused(payload, n) else super(Refuses, self).decode([payload])[0]
                    for n, payload in enumerate(payloads)]

    cpu = torch.device("cpu")
    assert sub_jpeg_failure(Refuses(cpu, lambda payload, n: is_440(payload))) == ""
    failure = sub_jpeg_failure(Refuses(cpu, lambda payload, n: is_440(payload) and n > 0))
    assert "could not decode the 4:4:0 probe or one of its sub-JPEGs" in failure
