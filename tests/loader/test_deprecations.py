"""The option objects are the API; every older spelling (a flat keyword such as `loader(max_length=...)`, the old
class names `Output` and `DeviceDecode`) still works, warns with a `FastdataDeprecationWarning` (a FutureWarning,
shown to users by default) naming its exact replacement, once per call site, and gives what the new spelling gives.
The docs' Deprecations page lists exactly the rows of `fastdata.deprecations.DEPRECATIONS`."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import fastdata
from fastdata.deprecations import DEPRECATIONS, FastdataDeprecationWarning
from fastdata.loader.spec import LoaderSpec
from fastdata.options import DeviceDecodeOptions, MixOptions, OutputOptions, RemoteOptions, TextOptions
from fastdata.presets import RandomResizedCrop

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "deprecations.md"

#: a value each deprecated keyword takes, and the object (keyword, class) that replaces it
VALUES: dict[str, Any] = {
    "dtype": torch.float32, "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25), "channels_last": True,
    "seq_len": 16, "packing": "best-fit", "max_length": 20, "bucketing": True, "eos_token": "<eos>",
    "boundaries": True, "mask_cross_document": True,
    "cache_dir": "/tmp/cache", "cache_max_bytes": "1GB", "storage_options": {"anon": True},
    "samples_per_epoch": 40, "epoch_end": "last", "exhausted": "stop",
}
OBJECTS = {"output": OutputOptions, "text": TextOptions, "remote": RemoteOptions, "mixing": MixOptions}
GROUPS = {"dtype": "output", "mean": "output", "std": "output", "channels_last": "output",
          "seq_len": "text", "packing": "text", "max_length": "text", "bucketing": "text", "eos_token": "text",
          "boundaries": "text", "mask_cross_document": "text", "cache_dir": "remote", "cache_max_bytes": "remote",
          "storage_options": "remote", "samples_per_epoch": "mixing", "epoch_end": "mixing", "exhausted": "mixing"}
LOADER_KEYWORDS = sorted(GROUPS)


def said(call: Any) -> tuple[Any, list[warnings.WarningMessage]]:
    """What `call()` returns and the fastdata deprecation warnings it gave, under Python's default filter."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        result = call()
    return result, [w for w in caught if issubclass(w.category, FastdataDeprecationWarning)]


def spec(path: Any = "data.lmdb", **given: Any) -> LoaderSpec:
    """The spec `fastdata.loader(path, **given)` makes (its first step; nothing is opened)."""
    named = {name: given.pop(name, None) for name in ("output", "text", "remote", "mixing", "weights")}
    return LoaderSpec.asked(path, given, augment=given.pop("augment", "train"),
                            image_size=given.pop("image_size", None), **named)


@pytest.mark.parametrize("keyword", LOADER_KEYWORDS)
def test_each_old_loader_keyword_warns_once_with_its_replacement_and_asks_the_same(keyword):
    group, value = GROUPS[keyword], VALUES[keyword]
    path = ["a.lmdb", "b.lmdb"] if group == "mixing" else "a.lmdb"

    def thrice() -> LoaderSpec:  # one call site, called three times (a loader made each epoch, say)
        made = [spec(path, **{keyword: value}) for _ in range(3)]
        assert made[0] == made[2]
        return made[0]

    old, caught = said(thrice)
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    replacement = f"fastdata.loader({group}={OBJECTS[group].__name__}({keyword}=...))"
    assert message == (f"fastdata.loader({keyword}=...) is deprecated: use {replacement} (the old spelling goes in "
                       "fastdata 0.3.0)")
    assert caught[0].filename == __file__  # attributed to the caller, not to fastdata
    new, quiet = said(lambda: spec(path, **{group: OBJECTS[group](**{keyword: value})}))
    assert quiet == [] and new == old


def test_several_old_keywords_warn_once_each():
    _, caught = said(lambda: spec(dtype=torch.float32, mean=(0.5, 0.5, 0.5), seq_len=8))
    assert sorted(re.match(r"fastdata\.loader\((\w+)=", str(w.message))[1] for w in caught) == [
        "dtype", "mean", "seq_len"]


def test_the_warning_is_a_future_warning_that_users_see():
    assert issubclass(FastdataDeprecationWarning, FutureWarning)
    assert not issubclass(FastdataDeprecationWarning, DeprecationWarning)  # hidden by default outside __main__


def test_old_output_keywords_give_the_same_batches(solid_lmdb):
    common = {"batch_size": 8, "num_workers": 0, "seed": 3, "image_size": 16}
    (old_loader, caught) = said(lambda: fastdata.loader(solid_lmdb, dtype=torch.float32, mean=(0.5, 0.4, 0.3),
                                                        std=(0.2, 0.25, 0.3), **common))
    assert len(caught) == 3
    new_loader = fastdata.loader(solid_lmdb, output=OutputOptions(torch.float32, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)),
                                 **common)
    [old] = [batch for batch, _ in zip(old_loader, range(1), strict=False)]
    [new] = [batch for batch, _ in zip(new_loader, range(1), strict=False)]
    assert old[0].dtype == torch.float32 and torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])


@pytest.mark.parametrize("text", [TextOptions(seq_len=16), TextOptions(packing="best-fit", seq_len=12),
                                  TextOptions(packing=False, max_length=20, bucketing=True)])
def test_old_text_keywords_give_the_same_batches(small_text_lmdb, text):
    common = {"batch_size": 4, "num_workers": 0, "seed": 1}
    flat = {name: value for name, value in vars(text).items() if value is not None}
    old_loader, caught = said(lambda: fastdata.loader(small_text_lmdb, **flat, **common))
    assert len(caught) == len(flat)
    old, new = next(iter(old_loader)), next(iter(fastdata.loader(small_text_lmdb, text=text, **common)))
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)


def test_old_scale_and_ratio_keywords_warn_and_draw_the_same_crops(solid_lmdb):
    common = {"batch_size": 8, "num_workers": 0, "seed": 2}
    old_loader, caught = said(lambda: fastdata.loader(solid_lmdb, image_size=16, scale=(0.3, 0.6), ratio=(0.9, 1.1),
                                                      **common))
    assert [str(w.message).split(" is ")[0] for w in caught] == ["fastdata.loader(scale=...)",
                                                                 "fastdata.loader(ratio=...)"]
    assert "RandomResizedCrop(size, scale=...)" in str(caught[0].message)
    new_loader = fastdata.loader(solid_lmdb, augment=RandomResizedCrop(16, scale=(0.3, 0.6), ratio=(0.9, 1.1)),
                                 **common)
    assert torch.equal(next(iter(old_loader))[0], next(iter(new_loader))[0])


def test_dataset_takes_max_length_as_the_loader_does(pairs_lmdb):
    """One spelling: `fastdata.dataset(text=TextOptions(max_length=...))` as `fastdata.loader(text=...)`; the old
    `dataset(max_length=...)` warns and gives the same rows."""
    new = fastdata.dataset(pairs_lmdb, text=TextOptions(max_length=12))
    old, caught = said(lambda: fastdata.dataset(pairs_lmdb, max_length=12))
    assert [str(w.message) for w in caught] == [
        "fastdata.dataset(max_length=...) is deprecated: use fastdata.dataset(text=TextOptions(max_length=...)) (the "
        "old spelling goes in fastdata 0.3.0)"]
    assert new[0][1]["input_ids"].shape == (12,)
    assert all(torch.equal(old[i][1]["input_ids"], new[i][1]["input_ids"]) for i in range(3))


def test_dataset_refuses_the_text_options_that_cut_rows(pairs_lmdb):
    with pytest.raises(fastdata.errors.ConfigError, match=r"^seq_len: cut text into rows for fastdata.loader"):
        fastdata.dataset(pairs_lmdb, text=TextOptions(seq_len=8))


def test_mix_keywords_warn_too(text_mix):
    a, b, _ = text_mix
    old, caught = said(lambda: fastdata.mix([a, b], epoch_end="last", batch_size=4))
    assert [str(w.message).split(" is ")[0] for w in caught] == ["fastdata.mix(epoch_end=...)"]
    assert len(old) == len(fastdata.mix([a, b], mixing=MixOptions(epoch_end="last"), batch_size=4))


def test_old_class_names_are_the_new_classes_and_warn():
    def module(name: str) -> Any:
        return importlib.import_module(name)  # (`fastdata.loader` is the function on the package face)

    for where, old, new in ((fastdata, "DeviceDecode", DeviceDecodeOptions),
                            (module("fastdata.options"), "DeviceDecode", DeviceDecodeOptions),
                            (module("fastdata.image.device"), "DeviceDecode", DeviceDecodeOptions),
                            (module("fastdata.options"), "Output", OutputOptions),
                            (module("fastdata.loader.options"), "Output", OutputOptions)):
        value, caught = said(lambda where=where, old=old: getattr(where, old))
        assert value is new
        assert len(caught) == 1 and f"use {where.__name__ if where is fastdata else 'fastdata.options'}." \
            f"{new.__name__}" in str(caught[0].message)
    with pytest.raises(AttributeError):
        module("fastdata.options").Nothing  # noqa: B018


def test_every_option_object_is_exported_from_one_place():
    import fastdata.options

    for name in ("OutputOptions", "TextOptions", "RemoteOptions", "MixOptions", "DeviceDecodeOptions"):
        assert getattr(fastdata, name) is getattr(fastdata.options, name)
        assert name in fastdata.options.__all__ and name in fastdata.__all__
        assert name.endswith("Options")


def test_the_docs_list_every_deprecation_with_its_replacement_and_release():
    rows = re.findall(r"^\| `(.+?)` \| (.+?) \| (\S+) \|$", DOCS.read_text(), flags=re.M)
    assert {old: (new, release) for old, new, release in rows} == {
        row.old: (f"`{row.new}`", row.removed_in) for row in DEPRECATIONS.values()}
