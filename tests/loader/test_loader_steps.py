"""`fastdata.loader` is three steps: a frozen `LoaderSpec` of what was asked, `resolve` that settles every "auto"
in one place (each auto's resolution tested here), and `build`, which configures the worker pipeline once with one
value (`PipelineConfig`) that the workers read (tested in a worker process)."""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastdata
from fastdata.config import available_cores
from fastdata.errors import ConfigError
from fastdata.image.loader import ImageLoader
from fastdata.image.pipeline import PipelineConfig
from fastdata.loader.build import build
from fastdata.loader.resolve import resolve
from fastdata.loader.spec import LoaderSpec
from fastdata.options import DeviceDecodeOptions, MixOptions, OutputOptions, TextOptions


def asked(path: Any, **given: Any) -> LoaderSpec:
    """The spec of `fastdata.loader(path, **given)` (the option objects only: no deprecated keywords)."""
    named = {name: given.pop(name, None) for name in ("output", "text", "remote", "mixing", "weights")}
    return LoaderSpec.asked(path, {}, augment=given.pop("augment", "train"), image_size=given.pop("image_size", None),
                            **named, **given)


def test_the_spec_is_frozen_and_holds_what_was_asked(solid_lmdb, pets_lmdb):
    spec = asked([solid_lmdb, pets_lmdb], weights=[1, 2], num_workers="auto", image_size=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_workers = 2  # type: ignore[misc]
    assert spec.path == (solid_lmdb, pets_lmdb) and spec.weights == (1, 2) and spec.is_mixture
    assert spec.num_workers == "auto" and spec.pin_memory is None and spec.decode == "auto"  # as asked, unresolved
    assert not asked([solid_lmdb]).is_mixture  # a list of one is that dataset
    hash(asked(solid_lmdb))  # frozen all through: nothing in it can change after the call


def test_the_spec_refuses_what_contradicts_itself_before_opening_anything(tmp_path):
    missing = tmp_path / "nothing-here.lmdb"
    for given, message in [({"tune_dir": tmp_path}, "tune_dir applies to"),
                           ({"weights": [1.0]}, "apply to a mixture"),
                           ({"mixing": MixOptions(epoch_end="last")}, "apply to a mixture"),
                           ({"num_workers": "many"}, "num_workers must be an int or 'auto'"),
                           ({"decode": 3}, "decode must be")]:
        with pytest.raises(ConfigError, match=message):
            asked(missing, **given)
    with pytest.raises(ConfigError, match="metadata=True applies to one dataset"):
        asked([missing, missing], metadata=True)


def test_resolve_settles_workers_prefetch_pinning_persistence_and_ranks(solid_lmdb):
    plan = resolve(asked(solid_lmdb, image_size=16))
    options = plan.options
    assert options.num_workers == min(available_cores(), 16)  # num_workers=None
    assert options.prefetch_factor == 2
    assert options.pin_memory is torch.cuda.is_available()  # pin_memory=None
    assert options.persistent_workers is True  # persistent_workers=None with augment="train"
    assert (options.rank, options.world_size) == (0, 1)  # rank/world_size=None, no torch.distributed
    assert resolve(asked(solid_lmdb, augment="val")).options.persistent_workers is False
    assert resolve(asked(solid_lmdb, augment=None)).options.persistent_workers is False
    chosen = resolve(asked(solid_lmdb, num_workers=1, pin_memory=False, persistent_workers=False, rank=1,
                           world_size=3)).options
    assert (chosen.num_workers, chosen.pin_memory, chosen.persistent_workers, chosen.rank, chosen.world_size) == (
        1, False, False, 1, 3)


def test_resolve_settles_auto_workers_and_prefetch_from_the_tune_result_or_the_defaults(solid_lmdb, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (said once per process: "no tune result ... using num_workers=...")
        plan = resolve(asked(solid_lmdb, num_workers="auto", prefetch_factor="auto", tune_dir=tmp_path))
    assert (plan.options.num_workers, plan.options.prefetch_factor) == (min(available_cores(), 16), 2)
    assert plan.tuned is not None and plan.tuned.source == "default" and plan.tuned.reason
    assert resolve(asked(solid_lmdb)).tuned is None  # nothing asked to be tuned


def test_resolve_settles_the_decode_placement_and_the_device(solid_lmdb, coco_lmdb, monkeypatch):
    image = resolve(asked(solid_lmdb)).image
    assert image is not None and image.decode == "worker" and image.device is None  # "auto", nothing measured
    on_cpu = resolve(asked(solid_lmdb, decode="device", device="cpu")).image
    assert on_cpu.decode == "device" and on_cpu.device == torch.device("cpu")
    options = DeviceDecodeOptions(slots=4)
    kept = resolve(asked(solid_lmdb, decode=options, device="cpu")).image
    assert kept.decode is options and kept.placement == "device" and kept.device_options is options
    detection = resolve(asked(coco_lmdb, decode="auto")).image
    assert detection.decode == "worker"  # the device path takes class labels and pairs only
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # decode="device" without a device: the GPU
    assert resolve(asked(solid_lmdb, decode="device")).image.device == torch.device("cuda")


def test_resolve_leaves_no_auto_for_text_and_mixtures(small_text_lmdb, solid_lmdb, pets_lmdb):
    text = resolve(asked(small_text_lmdb, text=TextOptions(seq_len=8)))
    assert text.image is None and text.options.num_workers == min(available_cores(), 16)
    assert text.options.persistent_workers is True
    mixture = resolve(asked([solid_lmdb, pets_lmdb], image_size=16))
    assert mixture.data is None and mixture.options.num_workers == min(available_cores(), 16)


def test_build_makes_what_the_plan_says(solid_lmdb, small_text_lmdb):
    built = build(resolve(asked(solid_lmdb, image_size=16, num_workers=0, batch_size=8)))
    assert isinstance(built, ImageLoader)
    assert built.decode == "worker" and built.num_workers == 0 and built.tuned is None
    text = build(resolve(asked(small_text_lmdb, text=TextOptions(seq_len=8), num_workers=0, batch_size=4)))
    assert next(iter(text))["input_ids"].shape == (4, 8)


def test_the_loader_configures_the_pipeline_once_with_one_value(solid_lmdb):
    loader = fastdata.loader(solid_lmdb, image_size=16, num_workers=0, output=OutputOptions(dtype=torch.float32))
    pipeline = loader.dataset.pipeline
    config = pipeline.config
    assert isinstance(config, PipelineConfig) and config.output.floating and config.delivered == config.output
    assert config.sizes is not None and not config.ship_encoded and not config.unstacked
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.ship_encoded = True  # type: ignore[misc]
    with pytest.raises(AttributeError):
        pipeline.output = config.output  # type: ignore[misc]  # read from the config, never written one by one
    device = fastdata.loader(solid_lmdb, image_size=16, num_workers=0, decode="device", device="cpu",
                             output=OutputOptions(dtype=torch.float32))
    shipped = device.dataset.pipeline.config
    assert shipped.ship_encoded and shipped.sub_jpegs is not None
    assert not shipped.output.floating and shipped.delivered.floating  # the device normalises, not the workers
    device.close()


class ConfigSeen(Dataset):
    """What a worker process sees of the pipeline it was given (forked or pickled into it)."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> dict:
        config = self.pipeline.config
        return {"floating": config.output.floating, "mean": list(config.output.mean), "encoded": config.ship_encoded,
                "sizes": list(self.pipeline.output_size_for(0))}


def test_the_workers_see_the_configuration(solid_lmdb):
    mean = (0.5, 0.4, 0.3)
    loader = fastdata.loader(solid_lmdb, image_size=(16, 12), num_workers=1, batch_size=8,
                             output=OutputOptions(dtype=torch.float32, mean=mean))
    pipeline = loader.dataset.pipeline
    carried = pickle.loads(pickle.dumps(pipeline)).config  # spawn carries it too (the sizes' shared memory)
    assert dataclasses.replace(carried, sizes=None) == dataclasses.replace(pipeline.config, sizes=None)
    assert carried.sizes is not None and carried.sizes.steps() == pipeline.config.sizes.steps()
    [seen] = DataLoader(ConfigSeen(pipeline), num_workers=1, batch_size=None)
    assert seen == {"floating": True, "mean": list(pipeline.config.output.mean), "encoded": False,
                    "sizes": [16, 12]}
    assert seen["mean"] == pytest.approx(mean)
    images, _ = next(iter(loader))  # made in the worker, in the configured dtype
    assert images.dtype == torch.float32 and images.shape[-2:] == (16, 12)
    loader.close()
