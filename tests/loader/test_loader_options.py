"""fastdata.loader validates its keywords into small frozen option objects (common LoaderOptions, ImageOptions,
TextOptions, RemoteOptions) that the image and text loaders take, instead of two dozen keywords passed down."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import pytest
import torch

import fastdata
from fastdata import FastdataDeprecationWarning
from fastdata.config import LoaderOptions
from fastdata.errors import ConfigError
from fastdata.formats.remote import RemoteOptions
from fastdata.image.loader import ImageOptions
from fastdata.text.loader import TextOptions


def test_options_are_frozen_and_validated():
    options = LoaderOptions(batch_size=8, num_workers=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.batch_size = 4  # type: ignore[misc]
    for bad, message in [({"batch_size": 0}, "batch_size"), ({"num_workers": -1}, "num_workers"),
                         ({"prefetch_factor": 0}, "prefetch_factor"), ({"timeout": -1}, "timeout")]:
        with pytest.raises(ConfigError, match=message):
            LoaderOptions(**bad)
    with pytest.raises(ConfigError, match="decode must be one of"):
        ImageOptions(decode="gpu")
    with pytest.raises(ConfigError, match=r"dtype must be a torch\.dtype"):
        ImageOptions(dtype="bfloat16")  # type: ignore[arg-type]
    assert ImageOptions(device="cpu").device == torch.device("cpu")
    assert RemoteOptions(cache_max_bytes="20GB").cache_max_bytes == 20 * 10**9
    assert TextOptions(seq_len=16, eos_token="</s>").given() == ["seq_len", "eos_token"]


@pytest.mark.parametrize(("options", "message"), [
    ({"image_size": "64"}, "image_size must be an int or (height, width) of ints, got '64' (str)"),
    ({"image_size": 64.0}, "image_size must be an int or (height, width) of ints, got 64.0 (float)"),
    ({"image_size": (64, "64")}, "image_size must be an int or (height, width) of ints, got (64, '64') (tuple)"),
    ({"batch_size": 32.0}, "batch_size must be an int, got 32.0 (float)"),
    ({"num_workers": "2"}, "num_workers must be an int or 'auto', got '2' (str)"),
    ({"seed": 1.5}, "seed must be an int, got 1.5 (float)"),
    ({"shuffle": "yes"}, "shuffle must be True or False, got 'yes' (str)"),
    ({"pin_memory": 1}, "pin_memory must be True or False, got 1 (int)"),
    ({"timeout": "30"}, "timeout must be a number, got '30' (str)"),
    ({"rank": "0", "world_size": 2}, "rank must be an int, got '0' (str)"),
    ({"augment": 3}, "augment must be None, 'train', 'val', an albumentations or torchvision transform or a "
                     "callable on an HWC uint8 array, got 3 (int)"),
])
def test_options_of_the_wrong_type_are_one_line_config_errors(solid_lmdb, options, message):
    """Refused when the loader is made, naming the option, the value and its type; not converted (32.0 is not
    taken for 32), and not left to fail later inside a worker with torch's traceback."""
    with pytest.raises(ConfigError) as info:
        fastdata.loader(solid_lmdb, **options)
    assert str(info.value) == message


def test_dataloader_kwargs_apply_worker_settings_only_with_workers():
    with_workers = LoaderOptions(num_workers=2, prefetch_factor=3, timeout=5, persistent_workers=True)
    assert with_workers.dataloader_kwargs()["prefetch_factor"] == 3
    without = LoaderOptions(num_workers=0, prefetch_factor=3, timeout=5).dataloader_kwargs()
    assert without["prefetch_factor"] is None and without["timeout"] == 0 and without["persistent_workers"] is False


def test_the_image_loader_takes_what_loader_validated(solid_lmdb):
    loader = fastdata.loader(solid_lmdb, batch_size=8, num_workers=2, prefetch_factor=3, timeout=30, seed=5,
                             pin_memory=False, image_size=16)
    assert loader.options == LoaderOptions(batch_size=8, shuffle=True, seed=5, num_workers=2, pin_memory=False,
                                           prefetch_factor=3, timeout=30)
    inner = loader._loader  # the DataLoader it wraps gets exactly those settings
    assert (inner.num_workers, inner.prefetch_factor, inner.timeout, inner.persistent_workers) == (2, 3, 30, True)
    with pytest.raises(ConfigError, match="seq_len: for text datasets only"):
        fastdata.loader(solid_lmdb, text=fastdata.TextOptions(seq_len=16))
    with pytest.raises(ConfigError, match="apply to remote URLs"):
        fastdata.loader(solid_lmdb, remote=fastdata.RemoteOptions(cache_dir="/tmp/x"))


def test_the_text_loader_takes_the_same_common_options(small_text_lmdb):
    loader = fastdata.loader(small_text_lmdb, batch_size=4, num_workers=1, timeout=20, pin_memory=False,
                             text=fastdata.TextOptions(seq_len=16))
    assert loader.options.timeout == 20 and loader._loader.timeout == 20  # text loaders honour timeout= too
    assert loader.options.batch_size == 4 and len(next(iter(loader))["input_ids"]) == 4


#: the image options, each set to a value that would apply to images
IMAGE_OPTIONS = {"augment": "val", "image_size": 32, "scale": (0.5, 1.0), "ratio": (1.0, 2.0), "device": "cpu",
                 "decode": "worker", "dtype": torch.float32, "channels_last": True, "mean": (0.5, 0.5, 0.5),
                 "std": (0.2, 0.2, 0.2)}
#: those that fastdata.dataset takes
DATASET_IMAGE_OPTIONS = ("augment", "image_size", "scale", "ratio")
OUTPUT_FIELDS = ("dtype", "channels_last", "mean", "std")  # given as output=OutputOptions(...)
TEXT_OPTIONS = {"seq_len": 16, "packing": False, "max_length": 32, "bucketing": True, "eos_token": "</s>"}


@pytest.mark.parametrize("option", list(IMAGE_OPTIONS))
def test_image_options_on_text_are_refused_by_name(small_text_lmdb, option):
    """Never silently ignored: one line naming the option and why (the dataset holds text), whatever else the
    option would need (mean without dtype is refused for being on text, not for the missing dtype)."""
    value = IMAGE_OPTIONS[option]
    opens = [fastdata.loader] + ([fastdata.dataset] if option in DATASET_IMAGE_OPTIONS else [])
    given = {"output": fastdata.OutputOptions(**{option: value})} if option in OUTPUT_FIELDS else {option: value}
    for open_it in opens:
        old = pytest.warns(FastdataDeprecationWarning) if option in ("scale", "ratio") else nullcontext()
        with pytest.raises(ConfigError, match=rf"^{option}: for image datasets only; .*text.lmdb holds text$"), old:
            open_it(small_text_lmdb, **given)


def test_no_augmentation_fits_text(small_text_lmdb):
    """augment=None asks for nothing, so text takes it (as it takes the loader's default, "train")."""
    for augment in (None, "train"):
        assert next(iter(fastdata.loader(small_text_lmdb, augment=augment, num_workers=0,
                                         text=fastdata.TextOptions(seq_len=8))))
    assert len(fastdata.dataset(small_text_lmdb, augment=None)) == 30


@pytest.mark.parametrize("option", list(TEXT_OPTIONS))
def test_text_options_on_images_are_refused_by_name(solid_lmdb, option):
    pairs = " and image-text pairs" if option == "max_length" else ""  # pairs take max_length (their token rows)
    with pytest.raises(ConfigError, match=rf"^{option}: for text datasets{pairs} only; .* holds images$"):
        fastdata.loader(solid_lmdb, text=TextOptions(**{option: TEXT_OPTIONS[option]}))
