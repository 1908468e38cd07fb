"""What a packed batch is made of, from rows of `seq_len + 1` tokens (a row's inputs and, one further, its labels):
what a worker writes into the hand-over, and the batch dict the main process makes of it.

A worker writes the rows themselves (int32 [B, L + 1], straight into the shared-memory hand-over), and with
`boundaries` the rows' `position_ids` (int32 [B, L], from `fastdata.text.boundaries`) after them; the segments'
starts, B * L and the longest segment travel beside them as one small array (`cu_seqlens` and `max_seqlen`). The
main process makes the int64 `input_ids` and `labels` (labels shifted by one) of the rows, and:

- best-fit rows (`padded`): positions past a row's tokens (the end of the row) hold IGNORE_INDEX in the rows, so
  `labels` has it there already; `input_ids` gets the padding id there, and `attention_mask` is 1 on the row's
  tokens;
- `mask_cross_document`: labels IGNORE_INDEX where the input is an end-of-text token.

Every step is one vectorised pass over the batch (or over its few segments): the main process, which takes the
batches of every worker, does per batch only what it must (each int64 array written once).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fastdata.text.boundaries import IGNORE_INDEX, positions, segment_bounds


@dataclass(frozen=True)
class RowsForm:
    """How rows of `seq_len + 1` tokens become a batch (see the module's docstring)."""

    seq_len: int
    eos_id: int
    pad_id: int | None = None  # None: packed blocks, every position a token; else best-fit rows, padded
    boundaries: bool = False
    mask_cross_document: bool = False
    _ramps: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # dtype -> arange, reused

    @property
    def padded(self) -> bool:
        return self.pad_id is not None

    def shapes(self, rows: int) -> list[tuple[int, ...]]:
        """The shapes of the int32 arrays a batch of `rows` rows hands over: the rows, then their positions."""
        rows_shape = (rows, self.seq_len + 1)
        return [rows_shape, (rows, self.seq_len)] if self.boundaries else [rows_shape]

    def row_ints(self) -> int:
        """How many int32 one row takes in the hand-over."""
        return sum(shape[1] for shape in self.shapes(1))

    def fill(self, parts: list[np.ndarray]) -> np.ndarray | None:
        """Complete a batch's hand-over once its rows are in `parts[0]` (int32 views, `shapes`); returns what
        travels beside it: with `boundaries` the segments' starts, B * L and the longest segment (int32), else
        None."""
        if not self.boundaries:
            return None
        bounds = segment_bounds(parts[0], self.eos_id)
        positions(bounds, parts[1], self._ramp(parts[1].size, parts[1].dtype))
        return bounds

    def _ramp(self, size: int, dtype: np.dtype) -> np.ndarray:
        """`arange(size)` (or longer) in `dtype`, made once per process and size: each batch's positions start
        from it."""
        ramp = self._ramps.get(np.dtype(dtype))
        if ramp is None or len(ramp) < size:
            ramp = self._ramps[np.dtype(dtype)] = np.arange(size, dtype=dtype)
        return ramp

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
        `parts` (int32 views into the transferred memory) and what travelled beside it. numpy does the few passes
        over the batch: on arrays this size it takes about half of torch's time per operation."""
        rows = parts[0]
        inputs = rows[:, :-1]
        input_ids, labels = inputs.astype(np.int64), rows[:, 1:].astype(np.int64)
        out: dict[str, torch.Tensor | int] = {"input_ids": torch.from_numpy(input_ids)}
        if self.padded:
            out["attention_mask"] = torch.from_numpy(self._unpad(inputs, input_ids))
        if self.mask_cross_document:
            np.copyto(labels, IGNORE_INDEX, where=inputs == self.eos_id)
        out["labels"] = torch.from_numpy(labels)
        if self.boundaries:
            assert bounds is not None, "a batch with boundaries has its segments beside it"
            out["position_ids"] = torch.from_numpy(parts[1].astype(np.int64))
            out["cu_seqlens"] = torch.as_tensor(bounds[:-1])  # numpy (or a tensor, through a DataLoader of one's
            out["max_seqlen"] = int(bounds[-1])  # own): shared, not copied
        return out
