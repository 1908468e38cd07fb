"""What a packed batch is made of, from rows of `seq_len + 1` tokens (a row's inputs and, one further, its labels):
the int32 arrays a worker hands over, and the batch dict the main process makes of them.

- packed blocks (`padded=False`): `input_ids`, `labels` (the rows themselves are handed over, L + 1 tokens each);
- best-fit rows (`padded=True`): positions past a row's tokens hold IGNORE_INDEX in the rows; `input_ids` has the
  padding id there, `labels` IGNORE_INDEX, and `attention_mask` is 1 on the row's tokens;
- `boundaries`: `position_ids` [B, L], `cu_seqlens` (int32, over the flattened batch) and `max_seqlen` (an int),
  from `fastdata.text.boundaries`;
- `mask_cross_document`: labels IGNORE_INDEX where the input is an end-of-text token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fastdata.text.boundaries import IGNORE_INDEX, cu_seqlens, mask_cross_document, position_ids, segment_starts


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

    @property
    def plain(self) -> bool:
        """Packed blocks as they are: the rows are the whole hand-over (written in place by the worker)."""
        return self.rows_handed_over and not self.boundaries

    @property
    def rows_handed_over(self) -> bool:
        """Whether the rows themselves are handed over (else their inputs and labels, each [B, L])."""
        return not (self.padded or self.mask_cross_document)

    @property
    def keys(self) -> tuple[str, ...]:
        keys = ("input_ids", "attention_mask", "labels") if self.padded else ("input_ids", "labels")
        return (*keys, "position_ids", "cu_seqlens", "max_seqlen") if self.boundaries else keys

    def row_ints(self) -> int:
        """About how many int32 one row takes in the hand-over."""
        ints = self.seq_len + 1 if self.rows_handed_over else (3 if self.padded else 2) * self.seq_len
        return ints + 2 * self.seq_len if self.boundaries else ints

    def parts(self, rows: np.ndarray) -> list[np.ndarray]:
        """The int32 arrays of one batch's hand-over, from its rows ([B, L + 1], any integer dtype)."""
        inputs = rows[:, :-1]
        real = inputs != IGNORE_INDEX if self.padded else None
        if not self.rows_handed_over:
            labels = rows[:, 1:].astype(np.int32)
            if self.mask_cross_document:
                mask_cross_document(labels, inputs, self.eos_id)
            ids = np.where(real, inputs, self.pad_id).astype(np.int32) if real is not None else \
                inputs.astype(np.int32)
            parts = [ids, real.astype(np.int32), labels] if real is not None else [ids, labels]
        else:
            parts = [rows.astype(np.int32, copy=False)]
        if self.boundaries:
            starts = segment_starts(inputs, self.eos_id, real)
            parts += [position_ids(starts), cu_seqlens(starts)]
        return parts

    def batch(self, parts: list[torch.Tensor]) -> dict[str, torch.Tensor | int]:
        """The batch dict (contiguous int64 tensors; `cu_seqlens` int32, `max_seqlen` an int) from the hand-over
        `parts` (views into the transferred tensor)."""
        left = iter(parts)
        first = next(left)
        if self.rows_handed_over:
            shape = (first.shape[0], self.seq_len)
            out = {"input_ids": torch.empty(shape, dtype=torch.int64).copy_(first[:, :-1]),
                   "labels": torch.empty(shape, dtype=torch.int64).copy_(first[:, 1:])}
        else:
            out = {"input_ids": first.to(torch.int64)}
            if self.padded:
                out["attention_mask"] = next(left).to(torch.int64)
            out["labels"] = next(left).to(torch.int64)
        if self.boundaries:
            out["position_ids"] = next(left).to(torch.int64)
            bounds = next(left)
            out["cu_seqlens"] = bounds[:-1].clone()
            out["max_seqlen"] = int(bounds[-1])
        return out
