"""`DevicePath`: `decode="device"` for one image loader, the one object the loader talks to.

It says what the workers ship (`shipping`, part of the pipeline's one configuration, given before they fork: JPEG
bytes and crop parameters; progressive JPEGs or not; sub-JPEGs once proved), owns the device stage
(fastdata.image.device.stage), the output slots (fastdata.image.device.ring) and the feeder of the pass being read
(fastdata.image.device.feeder), makes the decoder on the feeder's decode thread once the workers have forked
(`setup`), and counts what the device did not decode.
It holds no reference to the loader, whose passes it is given as a weak reference, so that a loader its user drops
is collected and its feeder stopped.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastdata.image.device.auto import (
    baseline_only,
    decoder_hints,
    device_decoder,
    ships_progressive,
    sub_jpeg_failure,
    warn_whole_files,
)
from fastdata.image.device.feeder import DeviceFeeder, PassKey, Reference, strong
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.device.ring import SlotRing
from fastdata.image.device.ship import SubJpegSwitch
from fastdata.image.device.stage import DeviceBatch, DeviceStage
from fastdata.image.device.streams import CudaStreams, streams_for
from fastdata.image.output import OutputFormat

if TYPE_CHECKING:
    from fastdata.image.pipeline import PipelineConfig


class DevicePath:
    """The device path of a loader over `pipeline`'s samples (see the module's docstring). `gpu_kinds`: the
    conversion's count of stored images by GPU kind (the manifest's `stats["gpu_kinds"]`); `sizes()`: the stored
    widths and heights, when the dataset records them (for the decoder's preallocation), read once the workers
    have forked; `streams`: the device's (tests give an emulation)."""

    def __init__(self, device: torch.device, pipeline: Any, source: str, batch_size: int, *,
                 output: OutputFormat, channels_last: bool, on_error: str, options: DeviceDecodeOptions | None = None,
                 gpu_kinds: Mapping[str, int] | None = None,
                 sizes: Callable[[], tuple[np.ndarray, np.ndarray] | None] | None = None,
                 streams: CudaStreams | None = None) -> None:
        self.options = options or DeviceDecodeOptions()
        self.streams = streams or streams_for(device)
        self.stage = DeviceStage(device, pipeline.output_size, source, output=output, channels_last=channels_last,
                                 on_error=on_error, max_pixels=pipeline.max_pixels, regions=self.options.regions,
                                 streams=self.streams)
        self.batch_size = batch_size
        self._pipeline = pipeline
        self._gpu_kinds = gpu_kinds
        self._sizes = sizes
        self.sub_jpegs = SubJpegSwitch()  # on once `setup` proved the decoder takes them (shared with the workers)
        self._ring: SlotRing | None = None
        self._feeder: DeviceFeeder | None = None
        self._closer: weakref.finalize | None = None

    def shipping(self, config: PipelineConfig) -> PipelineConfig:
        """The workers' configuration `config` with what this path has them ship: JPEG bytes and crop parameters,
        progressive JPEGs unless the decoder refuses them, sub-JPEGs once proved (the loader configures the
        pipeline with it once, before the workers fork)."""
        return dataclasses.replace(config, ship_encoded=True, ship_progressive=ships_progressive(self.options),
                                   sub_jpegs=self.sub_jpegs)

    def set_image_size(self, size: tuple[int, int]) -> None:
        """The batches' (height, width) from the next pass on (progressive resizing): a new size stops the feeder
        and gets slots of its own."""
        if tuple(size) != tuple(self.stage.image_size):
            self.close()
            self.stage.image_size, self._ring = (int(size[0]), int(size[1])), None

    def batches(self, key: PassKey, open_pass: Reference[Callable[[PassKey], Iterator[Any]]], owner: Any,
                follow: Callable[[PassKey], PassKey | None] | None = None) -> Iterator[DeviceBatch]:
        """Pass `key`'s device batches: from the feeder already preparing it (the epoch after the last), or from a
        new one (any other is closed first). `open_pass` opens the workers' pass; `owner` (the loader) stops the
        feeder when it is collected; `follow(key)`: the pass the feeder prepares after `key` (None: none; by
        default the next epoch). Neither may hold the loader."""
        feeder = self._feeder
        if feeder is None or not feeder.offers(key):
            self.close()
            last_write = feeder.last_write if feeder is not None else None  # its threads have ended
            if self._ring is None:
                stage, rows = self.stage, self.batch_size  # (the ring must not hold the loader)
                self._ring = SlotRing(self.options.slots, lambda: stage.new_output(rows), stage.device, self.streams)
            self._ring.restart(after=last_write)  # the new stream writes no slot the old one may still write
            feeder = self._feeder = DeviceFeeder(self.stage, self._ring, open_pass, key,
                                                 follow=follow or (lambda done: PassKey(done.epoch + 1)),
                                                 setup=strong(self.setup), streams=self.streams)
            self._closer = weakref.finalize(owner, feeder.close)  # a loader dropped mid-pass stops it
        yield from feeder.batches(key)

    def setup(self) -> None:
        """On the feeder's decode thread, after the workers have forked: the decoder, and over the restart layout
        the proof that it takes sub-JPEGs (until then the workers ship whole files)."""
        if self.stage.decoder is not None:
            return
        sizes = self._sizes() if self._sizes is not None else None
        hints = decoder_hints(self.batch_size, *(sizes or (None, None)))
        only_baseline = baseline_only(self.options, self._gpu_kinds)
        self.stage.decoder = device_decoder(self.stage.device, self.options, only_baseline, hints=hints)
        if self._pipeline.jpeg_layout == "restart" and self.options.sub_jpegs:
            failure = sub_jpeg_failure(self.stage.decoder)
            if failure:
                warn_whole_files(str(self.stage.device), failure)
            self.sub_jpegs.enable(not failure)

    def close(self) -> None:
        """Stop the feeder's threads, if a feeder runs (the next pass starts another)."""
        if self._feeder is not None:
            if self._closer is not None:
                self._closer.detach()
            self._feeder.close()
            self._feeder = None
        self.stage.close()

    @property
    def timings(self) -> dict[str, float]:
        """The stage's host and GPU seconds by part (fastdata.image.device.stage.TIMING_PARTS) and its batches."""
        return self.stage.timings

    @property
    def decoder_name(self) -> str | None:
        return self.stage.decoder.name if self.stage.decoder is not None else None

    @property
    def fallbacks(self) -> int:
        return self.stage.policy.fallbacks

    @property
    def errors(self) -> int:
        return self.stage.policy.errors

    @property
    def whole(self) -> int:
        return self.stage.policy.whole

    @property
    def rejected(self) -> int:
        return self.stage.policy.rejected
