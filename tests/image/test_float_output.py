"""Float output of the presets on the CPU path (`dtype=torch.float32|bfloat16|float16`, normalised with `mean`
and `std`, ImageNet's by default): the same values as torchvision's `ToDtype(float32, scale=True)` + `Normalize`
run by hand on the uint8 batch of the same loader, in main process and workers alike, the same as the device
path's (device="cpu"), on borrowed batches too; checked options; a resume state keeps the output format."""

from __future__ import annotations

import pytest
import torch
from builders.damaged import corrupt_copy
from torchvision.transforms import v2

import fastdata
from fastdata.errors import ConfigError, ResumeError
from fastdata.image.output import IMAGENET_MEAN, IMAGENET_STD

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def batches(path, **options) -> list[torch.Tensor]:
    settings = dict(batch_size=5, augment="val", image_size=(24, 40), shuffle=False, num_workers=0, seed=3)
    settings.update(options)
    return [images.clone() for images, _ in fastdata.loader(path, **settings)]


def by_hand(uint8: torch.Tensor, dtype: torch.dtype, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """torchvision's ToDtype(scale=True) + Normalize in float32, then the dtype asked for."""
    return v2.Normalize(list(mean), list(std))(v2.ToDtype(torch.float32, scale=True)(uint8)).to(dtype)


@pytest.mark.parametrize("augment", ["val", "train"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("normalisation", [{}, {"mean": MEAN, "std": STD}])
def test_float_batches_are_the_uint8_batches_normalised(photo_lmdb, augment, dtype, normalisation):
    uint8 = batches(photo_lmdb, augment=augment)
    floats = batches(photo_lmdb, augment=augment, output=fastdata.OutputOptions(dtype=dtype, **normalisation))
    assert len(floats) == len(uint8) == 3
    for ours, pixels in zip(floats, uint8, strict=True):
        assert ours.dtype == dtype and ours.shape == pixels.shape == (pixels.shape[0], 3, 24, 40)
        torch.testing.assert_close(ours, by_hand(pixels, dtype, **normalisation))  # dtype's own tolerance


def test_workers_and_the_device_path_give_the_same_floats(photo_lmdb):
    """One normalisation for all: workers (floats in reused shared-memory slots, two passes) and the main process
    give the same bits, and so does the device path (device="cpu": uint8 from the workers, normalised there)."""
    options = dict(output=fastdata.OutputOptions(dtype=torch.bfloat16, mean=MEAN, std=STD), augment="train")
    serial = batches(photo_lmdb, **options)
    loader = fastdata.loader(photo_lmdb, batch_size=5, image_size=(24, 40), shuffle=False, num_workers=2, seed=3,
                             **options)
    for epoch in range(2):
        loader.set_epoch(0)
        in_workers = [images.clone() for images, _ in loader]
        assert all(torch.equal(a, b) for a, b in zip(in_workers, serial, strict=True)), epoch
    on_device = batches(photo_lmdb, device="cpu", decode="worker", **options)
    assert all(torch.equal(a, b) for a, b in zip(on_device, serial, strict=True))


def test_a_borrowed_batch_is_normalised_as_the_others(solid_lmdb, tmp_path):
    """Batch 7 of one sample is undecodable and skipped: its replacement, made in the main process, is in the
    loader's dtype too."""
    path, _ = corrupt_copy(solid_lmdb, tmp_path, 7, b"not an image")
    options = dict(batch_size=1, image_size=16, on_error="skip")
    with pytest.warns(UserWarning, match="borrowed"):
        uint8 = batches(path, **options)
    with pytest.warns(UserWarning, match="borrowed"):
        floats = batches(path, output=fastdata.OutputOptions(dtype=torch.float16), **options)
    assert all(f.dtype == torch.float16 for f in floats)
    torch.testing.assert_close(floats[7], by_hand(uint8[7], torch.float16))


@pytest.mark.parametrize(("options", "message"), [
    ({"mean": MEAN}, r"^mean and std normalise floating batches: pass dtype="),
    ({"std": STD, "dtype": torch.uint8}, r"^mean and std normalise floating batches: pass dtype="),
    ({"dtype": torch.int32}, r"^dtype must be torch.uint8 or a floating dtype"),
    ({"dtype": "float32"}, r"^dtype must be a torch.dtype"),
    ({"dtype": torch.float32, "mean": (0.5, 0.5)}, r"^mean must be three finite numbers"),
    ({"dtype": torch.float32, "std": (0.5, 0, 0.5)}, r"^std must be positive"),
    ({"dtype": torch.float32, "mean": "abc"}, r"^mean must be three"),
])
def test_output_options_are_checked(photo_lmdb, options, message):
    with pytest.raises(ConfigError, match=message):
        fastdata.loader(photo_lmdb, augment="val", num_workers=0, output=fastdata.OutputOptions(**options))


def test_a_resume_state_keeps_the_output_format(photo_lmdb):
    options = dict(batch_size=5, augment="val", image_size=16, num_workers=0)
    loader = fastdata.loader(photo_lmdb, output=fastdata.OutputOptions(dtype=torch.float32), **options)
    next(iter(loader))
    state = loader.state_dict()
    fastdata.loader(photo_lmdb, output=fastdata.OutputOptions(dtype=torch.float32), **options).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"output='torch.float32, mean=.*' in the state, None here"):
        fastdata.loader(photo_lmdb, **options).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"output=.* in the state, 'torch.float32, mean=\(0.5, 0.5, 0.5\)"):
        fastdata.loader(photo_lmdb, output=fastdata.OutputOptions(dtype=torch.float32, mean=(0.5,) * 3),
                        **options).load_state_dict(state)


def test_mean_and_std_in_0_255_units_are_refused_in_one_line():
    from fastdata.errors import ConfigError
    from fastdata.image.output import OutputFormat

    for mean, std in (((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)), ((0.5, 0.5, 0.5), (58.4, 57.1, 57.4)),
                      ((123.7, 116.3, 103.5), (0.229, 0.224, 0.225))):
        with pytest.raises(ConfigError, match=r"0\.\.255 units.*divide by 255") as caught:
            OutputFormat(torch.float32, mean, std)
        assert "\n" not in str(caught.value)
    assert OutputFormat(torch.float32, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)).floating
