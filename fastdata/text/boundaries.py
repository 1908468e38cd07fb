"""Where the documents of a packed batch start, for attention that stays inside each document: `position_ids`
that restart at 0 on the token after each end-of-text token (and at each row's start), and the cumulative lengths
over the flattened batch that varlen attention kernels take (`cu_seqlens`, `max_seqlen`). Vectorised numpy over
a whole batch.

A worker finds the segments (`segment_starts`: one comparison over the rows it has just written and one
`flatnonzero`) and hands over only those, a few int32 per row; the main process makes the int64 `position_ids`
from them (`positions`: one `repeat` and one subtraction), the one pass over the batch it needs to write them
anyway. Handing over positions instead would cost a worker a pass to write them and the main process a pass to
read them back.

A padded row (best-fit packing) has its padding as one more segment of its own: it starts after the row's last
end-of-text token like a document would, and padding never starts a segment, even where the padding id is the
end-of-text id.
"""

from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index


def segment_starts(rows: np.ndarray, eos_id: int) -> np.ndarray:
    """The segments of the inputs of `rows` (int [B, L + 1]: a row's inputs and, one further, its last label;
    best-fit rows hold IGNORE_INDEX at their padding, which is never the end-of-text id) as int32
    [segments + 1]: their starts over the flattened B x L inputs, then B * L (`cu_seqlens`).

    One comparison over the contiguous rows and one `flatnonzero`, nothing sorted or merged: an end-of-text token
    at row r, column c < L - 1 starts a segment at r * L + c + 1 (its index in the rows, r * (L + 1) + c, less r,
    plus one), and so does every row's column L - 1, marked as if it held one: that is where the next row starts
    (after the last row, B * L). The label column starts nothing."""
    width = rows.shape[1]
    marks = rows == eos_id
    marks[:, -2] = True
    marks[:, -1] = False
    hits = np.flatnonzero(marks)
    starts = np.empty(len(hits) + 1, np.int32)
    starts[0] = 0
    np.subtract(hits, hits // width - 1, out=starts[1:])
    return starts


def positions(cu_seqlens: np.ndarray, ramp: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Each input's position in its segment (int64, flattened: B * L, `cu_seqlens[-1]`) and the longest segment
    (`max_seqlen`), from `cu_seqlens` (`segment_starts`): an input's place in the flattened batch less its
    segment's start. `ramp`: `arange(B * L)` (or longer, int64), when the caller keeps one."""
    total = int(cu_seqlens[-1])
    ramp = np.arange(total, dtype=np.int64) if ramp is None else ramp[:total]
    sizes = cu_seqlens[1:] - cu_seqlens[:-1]
    out = np.repeat(cu_seqlens[:-1].astype(np.int64), sizes)
    np.subtract(ramp, out, out=out)
    return out, int(sizes.max()) if len(sizes) else 0
