"""How small tensors cross from a DataLoader worker to the main process: by value, in the pickle.

torch's pickler shares every tensor through shared memory, and the main process then fetches each one's file
descriptor in a handshake with the worker's resource sharer thread, which waits for the worker's GIL while the worker
makes its next batch (benchmarks/device_handover.py). For a few kilobytes of labels, boxes or offsets, sending the
bytes is cheaper; large tensors (images, masks) stay shared memory.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import torch

#: A tensor up to this size crosses by value; a larger one as shared memory.
BY_VALUE_BYTES = 1 << 16


def by_value_if_small(value: Any) -> Any:
    """`value` as a numpy array (pickled by value) when it is a CPU tensor of at most BY_VALUE_BYTES; as it is
    otherwise (a large tensor, or not a tensor at all). `as_tensor` turns it back."""
    if (isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.requires_grad
            and value.numel() * value.element_size() <= BY_VALUE_BYTES):
        return value.numpy()
    return value


def as_tensor(value: Any) -> Any:
    """`by_value_if_small`'s other half: a numpy array back as a tensor; anything else as it is."""
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value


def fields_by_value(batch: Any, shared: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every field of the dataclass `batch`, small tensors by value (`by_value_if_small`), those named in `shared`
    as they are: the state its `__reduce__` hands to `rebuilt`."""
    return {field.name: getattr(batch, field.name) if field.name in shared
            else by_value_if_small(getattr(batch, field.name)) for field in fields(batch)}


def rebuilt(cls: type, state: dict[str, Any]) -> Any:
    """`fields_by_value`'s other half: the dataclass `cls` with its numpy arrays back as tensors."""
    return cls(**{name: as_tensor(value) for name, value in state.items()})
