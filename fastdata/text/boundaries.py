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


def segment_starts(input_ids: np.ndarray, eos_id: int, real: np.ndarray | None = None) -> np.ndarray:
    """bool [B, L]: True at each row's first position and after each end-of-text token that is a real token
    (`real`: where the row holds a token rather than padding; None: everywhere)."""
    starts = np.empty(input_ids.shape, bool)
    starts[:, 0] = True
    after = starts[:, 1:]
    np.equal(input_ids[:, :-1], eos_id, out=after)
    if real is not None:
        after &= real[:, :-1].astype(bool, copy=False)
    return starts


def segments(starts: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids: the position of each token in its segment, int32 [B, L], or written into `out`; bounds: int32
    [segments + 2], the segments' starts over the flattened batch, then B * L (together `cu_seqlens`), then the
    longest segment (`max_seqlen`)) from `starts` (`segment_starts`)."""
    first = np.flatnonzero(starts.reshape(-1)).astype(np.int32)
    bounds = np.empty(len(first) + 2, np.int32)
    bounds[:-2], bounds[-2] = first, starts.size
    lengths = np.diff(bounds[:-1])
    bounds[-1] = lengths.max(initial=0)
    out = np.empty(starts.shape, np.int32) if out is None else out
    flat = out.reshape(-1)
    flat[:] = np.repeat(first, lengths)  # each position's segment start ...
    np.subtract(np.arange(starts.size, dtype=np.int32), flat, out=flat)  # ... taken from its place
    return out, bounds
