"""Where the documents of a packed batch start, for attention that stays inside each document: `position_ids`
that restart at 0 on the token after each end-of-text token (and at each row's start), and the cumulative lengths
over the flattened batch that varlen attention kernels take (`cu_seqlens`, `max_seqlen`). Vectorised numpy over
a whole batch, run in the loader's workers.

A padded row (best-fit packing) has its padding as one more segment of its own: it starts after the row's last
end-of-text token like a document would, and padding never starts a segment, even where the padding id is the
end-of-text id.
"""

from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index


def segment_bounds(rows: np.ndarray, eos_id: int) -> np.ndarray:
    """The segments of the inputs of `rows` (int [B, L + 1]: a row's inputs and, one further, its last label;
    best-fit rows hold IGNORE_INDEX at their padding, which is never the end-of-text id) as int32 [segments + 2]:
    their starts over the flattened B x L inputs, then B * L (together `cu_seqlens`), then the longest
    (`max_seqlen`).

    One comparison over the contiguous rows and one `flatnonzero`, nothing sorted or merged: an end-of-text token
    at row r, column c < L - 1 starts a segment at r * L + c + 1 (its index in the rows, r * (L + 1) + c, less r,
    plus one), and so does every row's column L - 1, marked as if it held one: that is where the next row starts
    (after the last row, B * L). The label column starts nothing."""
    width = rows.shape[1]
    marks = rows == eos_id
    marks[:, -2] = True
    marks[:, -1] = False
    hits = np.flatnonzero(marks)
    bounds = np.empty(len(hits) + 2, np.int32)
    bounds[0] = 0
    np.subtract(hits, hits // width - 1, out=bounds[1:-1])
    bounds[-1] = np.diff(bounds[:-1]).max()
    return bounds


def positions(bounds: np.ndarray, out: np.ndarray, ramp: np.ndarray | None = None) -> np.ndarray:
    """Each input's position in its segment, written into `out` (int [B, L]), from `bounds` (`segment_bounds`):
    its place in the flattened batch less its segment's start. `ramp`: `arange(B * L)` (or longer) of `out`'s
    dtype, when the caller keeps one."""
    flat = out.reshape(-1)
    ramp = np.arange(flat.size, dtype=out.dtype) if ramp is None else ramp[:flat.size]
    np.subtract(ramp, np.repeat(bounds[:-2], np.diff(bounds[:-1])), out=flat)
    return out
