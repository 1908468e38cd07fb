"""What a packed batch is made of, from rows of `seq_len + 1` tokens (a row's inputs and, one further, its labels):
what a worker writes into the hand-over, and the batch dict the main process makes of it.

A worker writes the rows themselves (int32 [B, L + 1], straight into the shared-memory hand-over), and with
`boundaries` the rows' `position_ids` (int32 [B, L], from `fastdata.text.boundaries`) after them; the segments'
starts, B * L and the longest segment travel beside them as one small array (`cu_seqlens` and `max_seqlen`). The
main process makes the int64 `input_ids` and `labels` (labels shifted by one) of the rows, and:

- best-fit rows (`padded`): positions past a row's tokens hold IGNORE_INDEX in the rows, so `labels` has it there
  already; `input_ids` gets the padding id there, and `attention_mask` is 1 on the row's tokens;
- `mask_cross_document`: labels IGNORE_INDEX where the input is an end-of-text token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fastdata.text.boundaries import IGNORE_INDEX, segment_starts, segments


@dataclass(frozen=True)
class RowsForm:
    """How rows of `seq_len + 1` tokens become a batch (see the module's docstring)."""

    seq_len: int
    eos_id: int
    pad_id: int | None = None  # None: packed blocks, every position a token; else best-fit rows, padded
    boundaries: bool = False
    mask_cross_document: bool = False

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
        inputs = parts[0][:, :-1]
        real = inputs != IGNORE_INDEX if self.padded else None
        _, bounds = segments(segment_starts(inputs, self.eos_id, real), out=parts[1])
        return bounds

    def batch(self, parts: list[torch.Tensor], bounds: np.ndarray | torch.Tensor | None = None
              ) -> dict[str, torch.Tensor | int]:
        """The batch dict (contiguous int64 tensors; `cu_seqlens` int32, `max_seqlen` an int) from the hand-over
        `parts` (views into the transferred tensor) and what travelled beside it. numpy does the few passes over
        the batch: on arrays this size it takes about half of torch's time per operation."""
        rows = parts[0].numpy()
        inputs = rows[:, :-1]
        shape = inputs.shape
        input_ids, labels = np.empty(shape, np.int64), np.empty(shape, np.int64)
        np.copyto(input_ids, inputs)
        np.copyto(labels, rows[:, 1:])
        out: dict[str, torch.Tensor | int] = {"input_ids": torch.from_numpy(input_ids)}
        if self.pad_id is not None:  # padded
            padding = inputs == IGNORE_INDEX
            np.copyto(input_ids, self.pad_id, where=padding)
            out["attention_mask"] = torch.from_numpy(np.logical_not(padding, out=np.empty(shape, np.int64),
                                                                    casting="unsafe"))
        if self.mask_cross_document:
            np.copyto(labels, IGNORE_INDEX, where=inputs == self.eos_id)
        out["labels"] = torch.from_numpy(labels)
        if self.boundaries:
            assert bounds is not None, "a batch with boundaries has its segments beside it"
            positions = np.empty(shape, np.int64)
            np.copyto(positions, parts[1].numpy())
            out["position_ids"] = torch.from_numpy(positions)
            bounds = torch.as_tensor(bounds)  # a DataLoader hands numpy arrays over as tensors
            out["cu_seqlens"] = bounds[:-1]
            out["max_seqlen"] = int(bounds[-1])
        return out
