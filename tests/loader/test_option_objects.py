"""Option objects (`fastdata.options`, `fastdata.presets`): the options that apply to some datasets only travel as
one object each, and the keywords they group still work (deprecated: they warn): either spelling gives the same
batches; both at once, or a keyword a function does not take, is refused; `loader()` has at most 28 named parameters."""

from __future__ import annotations

import inspect

import pytest
import torch

import fastdata
from fastdata import FastdataDeprecationWarning
from fastdata.errors import ConfigError
from fastdata.options import MixOptions, OutputOptions, RemoteOptions, TextOptions
from fastdata.presets import RandomResizedCrop, ResizeCenterCrop, ScaleJitterCrop


def batches(loader, count: int = 3) -> list:
    taken = []
    for number, batch in enumerate(loader):
        if number == count:
            break
        taken.append(batch)
    return taken


def same(a: list, b: list) -> bool:
    def equal(x, y):
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return len(x) == len(y) and all(equal(i, j) for i, j in zip(x, y, strict=True))
        return x == y
    return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))


def test_loader_has_at_most_28_named_parameters_and_the_functions_share_the_objects():
    for function, most in ((fastdata.loader, 28), (fastdata.dataset, 28), (fastdata.mix, 28)):
        named = [p for p in inspect.signature(function).parameters.values() if p.kind != p.VAR_KEYWORD]
        assert len(named) <= most, (function.__name__, len(named))
    assert "remote" in inspect.signature(fastdata.dataset).parameters
    assert "mixing" in inspect.signature(fastdata.mix).parameters


def test_output_and_the_crop_preset_give_what_their_keywords_give(solid_lmdb):
    common = {"batch_size": 8, "num_workers": 0, "seed": 3}
    with pytest.warns(FastdataDeprecationWarning):  # the old keywords: deprecated, still working
        old = fastdata.loader(solid_lmdb, augment="train", image_size=16, scale=(0.5, 1.0), ratio=(0.9, 1.1),
                              dtype=torch.float32, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), **common)
    new = fastdata.loader(solid_lmdb, augment=RandomResizedCrop(16, scale=(0.5, 1.0), ratio=(0.9, 1.1)),
                          output=OutputOptions(torch.float32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), **common)
    got = batches(new)
    assert got[0][0].dtype == torch.float32 and got[0][0].shape[-2:] == (16, 16)
    assert same(batches(old), got)
    val_old = fastdata.loader(solid_lmdb, augment="val", image_size=16, **common)
    val_new = fastdata.loader(solid_lmdb, augment=ResizeCenterCrop(16), **common)
    assert same(batches(val_old), batches(val_new))
    # a different crop range draws different crops: the preset's fields are used, not dropped
    other = fastdata.loader(solid_lmdb, augment=RandomResizedCrop(16, scale=(0.08, 0.2)),
                            output=OutputOptions(torch.float32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), **common)
    assert not same(batches(other), got)


def test_dataset_takes_the_presets_and_the_old_keywords(solid_lmdb):
    with pytest.warns(FastdataDeprecationWarning, match=r"fastdata\.dataset\(scale=\.\.\.\) is deprecated"):
        old = fastdata.dataset(solid_lmdb, "train", image_size=12, scale=(0.3, 0.6), seed=2)
    new = fastdata.dataset(solid_lmdb, RandomResizedCrop(12, scale=(0.3, 0.6)), seed=2)
    assert all(torch.equal(old[i][0], new[i][0]) for i in range(5))


def test_text_options_give_what_their_keywords_give(small_text_lmdb):
    common = {"batch_size": 4, "num_workers": 0, "seed": 1}
    for keywords, options in (({"seq_len": 16}, TextOptions(seq_len=16)),
                              ({"packing": False, "max_length": 20, "bucketing": True},
                               TextOptions(packing=False, max_length=20, bucketing=True))):
        with pytest.warns(FastdataDeprecationWarning):
            old = batches(fastdata.loader(small_text_lmdb, **keywords, **common))
        new = batches(fastdata.loader(small_text_lmdb, text=options, **common))
        assert same(old, new) and old


def test_mix_options_give_what_their_keywords_give(text_mix):
    a, b, _ = text_mix
    with pytest.warns(FastdataDeprecationWarning):
        old = fastdata.loader([a, b], weights=[0.5, 0.5], samples_per_epoch=40, exhausted="stop", batch_size=4,
                              num_workers=0, text=TextOptions(seq_len=8))
    new = fastdata.loader([a, b], weights=[0.5, 0.5], mixing=MixOptions(samples_per_epoch=40, exhausted="stop"),
                          batch_size=4, num_workers=0, text=TextOptions(seq_len=8))
    assert len(old) == len(new) == 10
    assert same(batches(old, 10), batches(new, 10))
    with pytest.warns(FastdataDeprecationWarning):
        mixture_old = fastdata.mix([a, b], epoch_end="last", batch_size=4)
    mixture_new = fastdata.mix([a, b], mixing=MixOptions(epoch_end="last"), batch_size=4)
    assert len(mixture_old) == len(mixture_new)


def test_both_spellings_at_once_or_a_keyword_not_taken_are_refused(solid_lmdb, small_text_lmdb):
    with pytest.raises(ConfigError, match=r"either output=OutputOptions\(\.\.\.\) or dtype"):
        fastdata.loader(solid_lmdb, output=OutputOptions(torch.float32), dtype=torch.float16)
    with pytest.raises(ConfigError, match=r"either text=TextOptions\(\.\.\.\) or seq_len"):
        fastdata.loader(small_text_lmdb, text=TextOptions(seq_len=8), seq_len=16)
    with pytest.raises(ConfigError, match="image_size: already set by augment"):
        fastdata.loader(solid_lmdb, augment=RandomResizedCrop(16), image_size=32)
    with pytest.raises(TypeError, match="unexpected keyword argument 'seq_len'"):
        fastdata.dataset(solid_lmdb, seq_len=8)  # a text loader's option: dataset() has none
    with pytest.raises(TypeError, match="unexpected keyword argument 'sequence_length'"):
        fastdata.loader(solid_lmdb, sequence_length=8)
    with pytest.raises(ConfigError, match=r"must be a fastdata\.options\.OutputOptions"):
        fastdata.loader(solid_lmdb, output={"dtype": torch.float32})
    with pytest.raises(ConfigError, match="apply to remote URLs"):
        fastdata.loader(solid_lmdb, remote=RemoteOptions(cache_dir="/tmp/cache"))


def test_a_classification_preset_over_detection_is_refused(rect_lmdb):
    with pytest.raises(ConfigError, match="classification preset; a detection dataset takes"):
        fastdata.loader(rect_lmdb, augment=RandomResizedCrop(64), num_workers=0)
    loader = fastdata.loader(rect_lmdb, augment=ScaleJitterCrop(64), batch_size=2, num_workers=0)
    images, targets = next(iter(loader))
    assert images.shape[-2:] == (64, 64) and len(targets) == 2
