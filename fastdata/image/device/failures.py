"""What the device path does when decoding fails, and what it counts.

- A sample the device decoder does not take (PNG, CMYK, ...) is decoded in the workers: a *fallback*, expected,
  counted in `fallbacks`, never warned about.
- A JPEG the decoder cannot decode by region (only the crop's pixels) is decoded whole on the device: counted in
  `whole`, said once.
- Bytes the device decoder refuses while it decodes the rest of the batch are decoded on the CPU, beside the
  feeder (a side pool, never on its resize thread), as the worker path would decode them: *rejected* by the
  device, counted in `rejected` and said once. Bytes the CPU cannot decode either are a damaged sample and follow
  `on_error` exactly as on the worker path (raise CorruptSampleError, or skip and list). Neither is a device error:
  one decoder refusing what another accepts is about the bytes, not the device.
- A *device error* is the decoder failing as a whole while the bytes are fine:
  - a batched call that raises although each of its JPEGs then decodes alone on the device; or
  - a batch of two or more JPEGs of which the decoder decodes none (every call raising, or returning nothing)
    while the CPU decodes them (checked on the first one the CPU decodes).
  A broken decoder is never a silent CPU path: the first device error warns; each counts in `errors`;
  `max_consecutive_errors` batches in a row with one raise DeviceDecodeError, and so does running out of device
  memory, naming the batch's keys. On the CPU (`device="cpu"`) the same rules hold.
"""

from __future__ import annotations

import warnings

from fastdata.errors import CorruptSampleError, DeviceDecodeError

#: Batches in a row with device errors before the loader stops with DeviceDecodeError: one failed batch is
#: tolerated and warned about; a decoder that keeps failing is broken.
MAX_CONSECUTIVE_DEVICE_ERRORS = 3


def some_keys(keys: list[str]) -> str:
    """`keys 'a', 'b', ... (9 samples)`: a batch named by its first keys."""
    shown = ", ".join(map(repr, keys[:4]))
    return f"keys {shown}, ... ({len(keys)} samples)" if len(keys) > 4 else f"keys {shown}"


class DevicePolicy:
    """The counters and the decisions of one loader's device path (see the module's docstring). The decode thread
    writes `fallbacks`, `errors` and `whole`; the resize thread `rejected` (and the skipped samples)."""

    def __init__(self, source: str, device: str, on_error: str,
                 max_consecutive_errors: int = MAX_CONSECUTIVE_DEVICE_ERRORS) -> None:
        self.source = source
        self.device = device
        self.on_error = on_error
        self.max_consecutive_errors = max_consecutive_errors
        self.fallbacks = 0  # samples the device does not take, decoded in the workers
        self.rejected = 0  # bytes the device decoder refused, decoded on the CPU beside the feeder
        self.errors = 0  # failures of the decoder as a whole on bytes that decode
        self.whole = 0  # JPEGs the decoder could not decode by region, decoded whole on the device instead
        self._warned_whole = False
        self._failing_batches = 0
        self._warned_error = False
        self._warned_rejected = False

    def damaged(self, key: str, reason: str, skipped: list[tuple[str, str]]) -> None:
        """A sample no decoder can decode (or refused before decoding): on_error="raise" raises, "skip" lists it."""
        message = f"{self.source}: sample {key!r}: {reason}"
        if self.on_error == "raise":
            raise CorruptSampleError(message)
        skipped.append((key, message))

    def rejected_by_device(self, key: str, decoder: str, hint: str = "") -> None:
        """The device decoder returned nothing for `key`, which the CPU then decoded: count it, say it once (with
        the decoder's `hint` on what to do, if it has one)."""
        self.rejected += 1
        if not self._warned_rejected:
            self._warned_rejected = True
            warnings.warn(f"{self.source}: {decoder} on {self.device} could not decode sample {key!r}, which the "
                          "CPU decodes; such samples are decoded on the CPU in the main process, beside the feeder "
                          f"(counted in loader.device_rejected; said once){': ' + hint if hint else ''}",
                          RuntimeWarning, stacklevel=2)

    def whole_instead(self, key: str, decoder: str) -> None:
        """The decoder could not decode `key`'s crop region but decoded the whole image: count it, say it once."""
        self.whole += 1
        if not self._warned_whole:
            self._warned_whole = True
            warnings.warn(f"{self.source}: {decoder} on {self.device} could not decode sample {key!r} by region; "
                          "such JPEGs are decoded whole on the device (counted in loader.device_whole; said once)",
                          RuntimeWarning, stacklevel=2)

    def out_of_memory(self, exc: BaseException, keys: list[str], count: int) -> DeviceDecodeError:
        return DeviceDecodeError(
            f"{self.source}: the device decoder ran out of memory on {self.device} decoding the {count} JPEGs of a "
            f"batch ({some_keys(keys)}): {exc}. Lower batch_size, leave the loader more device memory, or decode "
            "in the workers: decode='worker'")

    def batch_done(self, error: tuple[str, BaseException | None] | None, keys: list[str]) -> None:
        """After each batch's decoding: `error` is (what failed, the exception if one was raised) when the decoder
        failed as a whole although the bytes decode; counts it, warns on the first, raises after too many failing
        batches in a row."""
        if error is None:
            self._failing_batches = 0
            return
        what, exc = error
        self.errors += 1
        self._failing_batches += 1
        said = f"{what}: {exc}" if exc is not None else what
        if self._failing_batches >= self.max_consecutive_errors:
            raise DeviceDecodeError(
                f"{self.source}: the device decoder on {self.device} failed in {self._failing_batches} batches in a "
                f"row (the last: {some_keys(keys)}; {said}); it is not working: decode in the workers with "
                "decode='worker'") from exc
        if not self._warned_error:
            self._warned_error = True
            warnings.warn(
                f"{self.source}: the device decoder on {self.device} failed: {said}; this batch was decoded "
                "without it. Device errors are counted in loader.device_errors (this warning is shown once); "
                f"{self.max_consecutive_errors} batches in a row with device errors raise DeviceDecodeError",
                RuntimeWarning, stacklevel=2)
