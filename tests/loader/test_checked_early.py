"""Bad values are refused where they are given, in one line naming the argument and what it takes: `seed` and
`set_epoch` on every loader kind (image LMDB and WebDataset, text LMDB and WebDataset, image and text mixtures,
`fastdata.dataset`, `fastdata.mix`), and the option objects in their constructors, not later inside `loader()` or
at the first batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastdata
from fastdata import FastdataDeprecationWarning
from fastdata.errors import ConfigError
from fastdata.options import MixOptions, OutputOptions, RemoteOptions, TextOptions


@pytest.fixture(scope="module")
def every_loader(solid_lmdb, solid_wds, pets_lmdb, text_mix):
    """A maker per loader kind: `make(**options)` gives that kind's loader."""
    image = {"image_size": 16, "num_workers": 0, "batch_size": 8}
    text = {"text": TextOptions(seq_len=8), "num_workers": 0, "batch_size": 4}
    return {
        "image lmdb": lambda **o: fastdata.loader(solid_lmdb, **image, **o),
        "image wds": lambda **o: fastdata.loader(solid_wds, **image, **o),
        "text lmdb": lambda **o: fastdata.loader(text_mix[0], **text, **o),
        "text wds": lambda **o: fastdata.loader(text_mix[1], **text, **o),
        "image mixture": lambda **o: fastdata.loader([solid_lmdb, pets_lmdb], **image, **o),
        "text mixture": lambda **o: fastdata.loader([text_mix[0], text_mix[1]], **text, **o),
    }


KINDS = ["image lmdb", "image wds", "text lmdb", "text wds", "image mixture", "text mixture"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_negative_seed_is_refused_by_name(every_loader, kind):
    with pytest.raises(ConfigError) as raised:
        every_loader[kind](seed=-1)
    assert str(raised.value) == "seed must be at least 0, got -1"


def test_a_negative_seed_is_refused_by_dataset_and_mix(solid_lmdb, solid_wds, pets_lmdb, small_text_lmdb):
    for make in (lambda: fastdata.dataset(solid_lmdb, seed=-1), lambda: fastdata.dataset(solid_wds, seed=-1),
                 lambda: fastdata.dataset(small_text_lmdb, seed=-1),
                 lambda: fastdata.mix([solid_lmdb, pets_lmdb], seed=-1)):
        with pytest.raises(ConfigError, match=r"^seed must be at least 0, got -1$"):
            make()


BAD_EPOCHS = [("1", "epoch must be an int, got '1' (str)"), (1.5, "epoch must be an int, got 1.5 (float)"),
              (True, "epoch must be an int, got True (bool)"), (-1, "epoch must be at least 0, got -1")]


@pytest.mark.parametrize("kind", KINDS)
def test_set_epoch_takes_non_negative_ints_only(every_loader, kind):
    """`set_epoch('1')` and `set_epoch(1.5)` do not quietly run epoch 1, and `set_epoch(-1)` is refused at the
    call, not at the next pass; the loader keeps the epoch it had. numpy integers (from a range of an array) are
    epochs."""
    loader = every_loader[kind]()
    loader.set_epoch(2)
    for bad, message in BAD_EPOCHS:
        with pytest.raises(ConfigError) as raised:
            loader.set_epoch(bad)
        assert str(raised.value) == message
        assert loader.epoch == 2
    loader.set_epoch(np.int64(3))
    assert loader.epoch == 3 and type(loader.epoch) is int


def test_set_epoch_of_datasets_and_mixtures_is_checked_too(solid_lmdb, solid_wds, pets_lmdb):
    for target in (fastdata.dataset(solid_lmdb), fastdata.dataset(solid_wds),
                   fastdata.mix([solid_lmdb, pets_lmdb], batch_size=4)):
        for bad, message in BAD_EPOCHS:
            with pytest.raises(ConfigError) as raised:
                target.set_epoch(bad)
            assert str(raised.value) == message


@pytest.mark.parametrize(("make", "message"), [
    (lambda: OutputOptions(dtype="float32"), "dtype must be a torch.dtype (e.g. torch.bfloat16), got 'float32'"),
    (lambda: OutputOptions(dtype=torch.int32), "dtype must be torch.uint8 or a floating dtype"),
    (lambda: OutputOptions(mean=(0.5, 0.5)), "mean must be three finite numbers (one per RGB channel, 0..1 units), got "
                                      "(0.5, 0.5)"),
    (lambda: OutputOptions(dtype=torch.float32, std=(0.0, 0.2, 0.2)), "std must be positive"),
    (lambda: OutputOptions(channels_last="yes"), "channels_last must be True or False"),
    (lambda: MixOptions(epoch_end="longest"), "epoch_end must be one of ('first', 'last'), got 'longest'"),
    (lambda: MixOptions(exhausted="repeat"), "exhausted must be one of ('cycle', 'stop'), got 'repeat'"),
    (lambda: MixOptions(samples_per_epoch=0), "samples_per_epoch must be at least 1, got 0"),
    (lambda: MixOptions(samples_per_epoch="100"), "samples_per_epoch must be an int"),
    (lambda: TextOptions(packing=True, max_length=64), "max_length: for padded batches (packing=False)"),
    (lambda: TextOptions(packing=False, seq_len=64), "seq_len applies to packed blocks"),
    (lambda: RemoteOptions(cache_dir=3), "cache_dir must be a folder (a str or os.PathLike), got 3 (int)"),
    (lambda: RemoteOptions(storage_options="anon"), "storage_options must be a dict of fsspec options"),
    (lambda: RemoteOptions(cache_max_bytes="lots"), "cannot read 'lots' as a size"),
])
def test_option_objects_are_checked_when_they_are_made(make, message):
    with pytest.raises(ConfigError) as raised:
        make()
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_option_objects_that_fit_are_made_as_given():
    assert OutputOptions(dtype=torch.float32, mean=(0.5, 0.5, 0.5)).mean == (0.5, 0.5, 0.5)
    assert MixOptions(samples_per_epoch=np.int64(10), epoch_end="last", exhausted="stop").epoch_end == "last"
    assert TextOptions(max_length=64).max_length == 64  # image-text pairs take max_length alone
    assert TextOptions(packing=False, bucketing=True, max_length=64).bucketing


def test_dataset_takes_output_as_the_loader_makes_its_batches(solid_lmdb):
    """`fastdata.dataset(..., output=OutputOptions(dtype=...))` gives each image normalised exactly as the loader's
    batch holds it (the same dtype, mean and std), instead of a TypeError."""
    out = OutputOptions(dtype=torch.float32, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3))
    data = fastdata.dataset(solid_lmdb, augment="val", image_size=16, output=out)
    loader = fastdata.loader(solid_lmdb, augment="val", image_size=16, output=out, batch_size=5, shuffle=False,
                             num_workers=0)
    images, labels = next(iter(loader))
    for row in range(5):
        image, label = data[row]
        assert image.dtype == torch.float32 and torch.equal(image, images[row]) and label == labels[row]
    with pytest.warns(FastdataDeprecationWarning, match=r"use fastdata\.dataset\(output=OutputOptions\(dtype="):
        same = fastdata.dataset(solid_lmdb, augment="val", image_size=16, dtype=torch.float32)  # the old keyword, too
    assert same[0][0].dtype == torch.float32


@pytest.mark.parametrize(("options", "message"), [
    ({"output": OutputOptions(dtype=torch.float32)}, "applies to augment='train'/'val'"),
    ({"augment": "val", "output": OutputOptions(mean=(0.5, 0.5, 0.5))}, "mean and std normalise floating batches"),
    ({"augment": "val", "output": OutputOptions(dtype=torch.float32, channels_last=True)}, "channels_last applies to "
                                                                                    "batches on a device"),
])
def test_dataset_refuses_an_output_that_does_not_apply(solid_lmdb, options, message):
    with pytest.raises(ConfigError, match=message):
        fastdata.dataset(solid_lmdb, **options)


def test_dataset_refuses_an_output_for_text(small_text_lmdb):
    with pytest.raises(ConfigError, match=r"^dtype: for image datasets only; .*holds text$"):
        fastdata.dataset(small_text_lmdb, output=OutputOptions(dtype=torch.float32))
