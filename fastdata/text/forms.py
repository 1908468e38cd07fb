"""What a packed batch is made of, from rows of `seq_len + 1` tokens (a row's inputs and, one further, its labels):
what a worker writes into the hand-over, and the batch dict the main process makes of it.

A worker writes the rows themselves (int32 [B, L + 1], straight into the shared-memory hand-over). The main process
makes the int64 `input_ids` and `labels` (labels shifted by one) of the rows, and:

- best-fit rows (`padded`): positions past a row's tokens (the end of the row) hold IGNORE_INDEX in the rows, so
  `labels` has it there already; `input_ids` gets the padding id there, and `attention_mask` is 1 on the row's
  tokens;
- `mask_cross_document`: labels IGNORE_INDEX where the input is an end-of-text token;
- `boundaries`: `position_ids`, `cu_seqlens` and `max_seqlen` (`fastdata.text.boundaries`).

With the C extension (`fastdata.text.kernel`) the main process reads each row once and writes every array in the
same pass, the boundaries too: a worker hands over the rows alone. Without it, numpy (the reference the extension is
tested against) takes a pass per array, and with `boundaries` a worker finds the segments (`cu_seqlens`, a few
int32 beside the rows) and the main process makes the positions of them.

Every step is one vectorised pass over the batch (or over its few segments): the main process, which takes the
batches of every worker, does per batch only what it must (each int64 array written once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import torch

from fastdata.text.boundaries import IGNORE_INDEX, positions, segment_starts
from fastdata.text.kernel import rows_kernel


@dataclass(frozen=True)
class RowsForm:
    """How rows of `seq_len + 1` tokens become a batch (see the module's docstring)."""

    seq_len: int
    eos_id: int
    pad_id: int | None = None  # None: packed blocks, every position a token; else best-fit rows, padded
    boundaries: bool = False
    mask_cross_document: bool = False
    kernel: bool = True  # the C extension where it was built (False: numpy, the reference)
    _arrays: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # `_scratch`, reused

    def __post_init__(self) -> None:
        """Whether the extension loads is asked where the form is made (the main process, which says once when it
        does not): the workers get the answer with the form, and do not say it again."""
        object.__setattr__(self, "kernel", self.kernel and rows_kernel() is not None)

    @property
    def padded(self) -> bool:
        return self.pad_id is not None

    def shapes(self, rows: int) -> list[tuple[int, ...]]:
        """The shapes of the int32 arrays a batch of `rows` rows hands over: the rows."""
        return [(rows, self.seq_len + 1)]

    def row_ints(self) -> int:
        """How many int32 one row takes in the hand-over."""
        return sum(shape[1] for shape in self.shapes(1))

    def fill(self, parts: list[np.ndarray]) -> np.ndarray | None:
        """Complete a batch's hand-over once its rows are in `parts[0]` (int32 views, `shapes`); returns what
        travels beside it: with `boundaries` and no C extension the segments' starts and B * L (`cu_seqlens`,
        int32), else None."""
        return segment_starts(parts[0], self.eos_id) if self.boundaries and self._kernel() is None else None

    def _kernel(self) -> ModuleType | None:
        return rows_kernel() if self.kernel else None

    def _scratch(self, name: str, size: int, dtype: type) -> np.ndarray:
        """`name`'s array of `size` (or longer), made once per process: the int64 `arange` each batch's positions
        start from (numpy), the int32 segment starts a batch's `cu_seqlens` are copied from (the extension)."""
        array = self._arrays.get(name)
        if array is None or len(array) < size:
            array = self._arrays[name] = np.arange(size, dtype=dtype) if name == "ramp" else np.empty(size, dtype)
        return array

    def _unpad(self, inputs: np.ndarray, input_ids: np.ndarray) -> np.ndarray:
        """The attention mask of padded rows' `inputs` (int64: 1 on a row's tokens), the padding id written into
        `input_ids` where they are padding. A row's padding is the end of the row (and few rows have any: best-fit
        fills most exactly): a fill of ones, and two slices for each row whose last input is padding, rather than
        passes over the whole batch to find it."""
        mask = np.ones(inputs.shape, np.int64)
        padded = np.flatnonzero(inputs[:, -1] == IGNORE_INDEX)
        if len(padded):
            starts = np.argmax(inputs[padded] == IGNORE_INDEX, axis=1)
            for row, start in zip(padded.tolist(), starts.tolist(), strict=True):
                mask[row, start:] = 0
                input_ids[row, start:] = self.pad_id
        return mask

    def batch(self, parts: list[np.ndarray], bounds: np.ndarray | torch.Tensor | None = None
              ) -> dict[str, torch.Tensor | int]:
        """The batch dict (contiguous int64 tensors; `cu_seqlens` int32, `max_seqlen` an int) from the hand-over
        `parts` (int32 views into the transferred memory) and what travelled beside it (`fill`)."""
        rows = parts[0]
        kernel = self._kernel()
        if kernel is not None and rows.dtype == np.int32 and rows.flags.c_contiguous:
            return self._batch_in_one_pass(kernel, rows)
        return self._batch_numpy(rows, bounds)

    def _batch_in_one_pass(self, kernel: ModuleType, rows: np.ndarray) -> dict[str, torch.Tensor | int]:
        count, shape = len(rows), (len(rows), self.seq_len)
        input_ids, labels = np.empty(shape, np.int64), np.empty(shape, np.int64)
        mask = np.empty(shape, np.int64) if self.padded else None
        position_ids = np.empty(shape, np.int64) if self.boundaries else None
        cells = count * self.seq_len
        starts = self._scratch("starts", cells + 1, np.int32)[:cells + 1] if self.boundaries else None
        segments, longest = kernel.batch(rows, count, self.seq_len, self.eos_id, self.pad_id or 0,
                                         self.mask_cross_document, input_ids, labels, mask, position_ids, starts)
        out: dict[str, torch.Tensor | int] = {"input_ids": torch.from_numpy(input_ids)}
        if mask is not None:
            out["attention_mask"] = torch.from_numpy(mask)
        out["labels"] = torch.from_numpy(labels)
        if position_ids is not None and starts is not None:
            out["position_ids"] = torch.from_numpy(position_ids)
            out["cu_seqlens"] = torch.from_numpy(starts[:segments + 1].copy())
            out["max_seqlen"] = longest
        return out

    def _batch_numpy(self, rows: np.ndarray, bounds: np.ndarray | torch.Tensor | None
                     ) -> dict[str, torch.Tensor | int]:
        """`batch` with numpy, a pass per array: on arrays this size about half of torch's time per operation."""
        inputs = rows[:, :-1]
        input_ids, labels = inputs.astype(np.int64), rows[:, 1:].astype(np.int64)
        out: dict[str, torch.Tensor | int] = {"input_ids": torch.from_numpy(input_ids)}
        if self.padded:
            out["attention_mask"] = torch.from_numpy(self._unpad(inputs, input_ids))
        if self.mask_cross_document:
            np.copyto(labels, IGNORE_INDEX, where=inputs == self.eos_id)
        out["labels"] = torch.from_numpy(labels)
        if self.boundaries:  # the segments beside the rows (numpy in the worker too), else found here
            cu_seqlens = segment_starts(rows, self.eos_id) if bounds is None else np.asarray(bounds)
            flat, longest = positions(cu_seqlens, self._scratch("ramp", input_ids.size, np.int64))
            out["position_ids"] = torch.from_numpy(flat.reshape(input_ids.shape))
            out["cu_seqlens"] = torch.from_numpy(cu_seqlens)
            out["max_seqlen"] = longest
        return out
