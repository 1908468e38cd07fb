"""Per-stage time of the read side (read, decode, augment, collate, transfer), recorded inside the workers
with every batch and summed by the loader, so that `fastdata.meter` can say which stage is the wall."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

STAGES = ("read", "decode", "augment", "collate", "transfer", "device")


@dataclass
class StageTimes:
    """Seconds spent in each stage (summed over samples, batches and workers) and the batches counted.

    read: storage to encoded bytes; decode: bytes to pixels; augment: crop/resize/flip or the custom transform;
    collate: building the batch tensor; transfer: pinning it for the host-to-device copy (pin-memory thread);
    device: decode="device"'s feeder thread(s) (decode, batched crop and resize on the device: the host's time to
    queue them, which runs beside the training step). `parts`: decode="device"'s feeder by thread and stream,
    its running totals (seconds by part, and "batches": fastdata.image.device.stage.TIMING_PARTS), which the
    loader copies as they grow.
    """

    read: float = 0.0
    decode: float = 0.0
    augment: float = 0.0
    collate: float = 0.0
    transfer: float = 0.0
    device: float = 0.0
    batches: int = 0
    parts: dict[str, float] = field(default_factory=dict)

    def add(self, other: StageTimes) -> None:
        """Add `other`'s figures to these (in place)."""
        for f in fields(self):
            if f.name == "parts":
                for name, value in other.parts.items():
                    self.parts[name] = self.parts.get(name, 0.0) + value
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def minus(self, other: StageTimes) -> StageTimes:
        """These figures less `other`'s (what happened since `other` was copied)."""
        parts = {name: value - other.parts.get(name, 0.0) for name, value in self.parts.items()}
        return StageTimes(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)
                             if f.name != "parts"}, parts=parts)

    def copy(self) -> StageTimes:
        return StageTimes(**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "parts"},
                          parts=dict(self.parts))

    @property
    def total(self) -> float:
        """Seconds over all stages."""
        return sum(getattr(self, name) for name in STAGES)

    def seconds(self) -> dict[str, float]:
        """Seconds per stage, in flow order."""
        return {name: getattr(self, name) for name in STAGES}
