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


def position_ids(starts: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The position of each token in its segment (int32 [B, L], or written into `out`): 0 where `starts`, then
    counting up."""
    flat = np.arange(starts.size, dtype=np.int32)
    last = np.where(starts.reshape(-1), flat, 0)
    np.maximum.accumulate(last, out=last)  # the latest start at or before each position (rows start with one)
    out = np.empty(starts.shape, np.int32) if out is None else out
    np.subtract(flat, last, out=out.reshape(-1))
    return out


def cu_seqlens(starts: np.ndarray) -> np.ndarray:
    """int32 [segments + 2]: the segments' starts over the flattened batch, then B * L (`cu_seqlens`), then the
    longest segment (`max_seqlen`): what `split_cu_seqlens` takes apart in the main process."""
    bounds = np.append(np.flatnonzero(starts.reshape(-1)), starts.size).astype(np.int32)
    return np.append(bounds, np.diff(bounds).max(initial=0)).astype(np.int32)


def mask_cross_document(labels: np.ndarray, input_ids: np.ndarray, eos_id: int) -> None:
    """Set `labels` to IGNORE_INDEX where the input is an end-of-text token: that position would predict the
    next document's first token, which its own document does not let it see."""
    labels[input_ids == eos_id] = IGNORE_INDEX
