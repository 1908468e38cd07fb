"""Best-fit packed rows: each row exactly `seq_len` tokens of whole documents, each followed by its end-of-text
token, the rest padding; a document longer than a row is cut into row-sized pieces. The rows of an epoch are
planned from the stored document lengths alone (`fastdata.order.packing`, in the main process); the main process
describes each batch as the token ranges its rows hold, and a worker reads them (one `read_many`) and lays them out.

The labels are the next token in the row, as for packed blocks: a document's last token has its end-of-text
token as its label, and an end-of-text token the next document's first token (IGNORE_INDEX where padding follows,
or with `mask_cross_document`). A row that ends inside a cut document has the document's next token as its last
label.
"""

from __future__ import annotations

import numpy as np
import torch

from fastdata.formats.tokens import TokenReader
from fastdata.order.packing import DEFAULT_WINDOW, Pieces, RowPlanner
from fastdata.text.boundaries import IGNORE_INDEX
from fastdata.text.forms import RowsForm

#: columns of a batch's description: the first token's place in the token stream, tokens read, whether the
#: document's end-of-text token follows them, and the row (a position in the batch)
_START, _COUNT, _EOS, _ROW = range(4)


class BestFitRows:
    """Rows of best-fit packed documents; `planner` (main process only) plans each epoch's rows."""

    def __init__(self, store: TokenReader, seq_len: int, eos_id: int, pad_id: int, seed: int, shuffle: bool,
                 window: int = DEFAULT_WINDOW) -> None:
        self.store = store
        self.seq_len = seq_len
        self.eos_id, self.pad_id = int(eos_id), int(pad_id)
        self.window = window
        self.form = RowsForm(seq_len, self.eos_id, self.pad_id)
        self.planner: RowPlanner | None = RowPlanner(Pieces(store.ends, seq_len), seed, shuffle, window)

    def __getstate__(self) -> dict:  # a worker only lays out what the main process describes
        return {**self.__dict__, "planner": None}

    def shaped(self, boundaries: bool = False, mask_cross_document: bool = False) -> BestFitRows:
        """These rows with document boundaries in the batch and / or cross-document labels masked."""
        self.form = RowsForm(self.seq_len, self.eos_id, self.pad_id, boundaries, mask_cross_document)
        return self

    @property
    def pieces(self) -> Pieces:
        assert self.planner is not None, "planned in the main process"
        return self.planner.pieces

    def describe(self, epoch: int, rows: np.ndarray) -> np.ndarray:
        """The epoch's rows `rows` as the token ranges they hold (int64 [ranges, 4]; main process): each piece of a
        document, and one position more for a piece its row ends inside of (the row's last label)."""
        plan = self.planner.plan(epoch) if self.planner is not None else None
        assert plan is not None, "described in the main process"
        pieces, row_of = plan.rows(rows)
        docs, start, size = self.pieces.locate(pieces)
        ends = self.pieces.ends
        length = self.pieces.length_of(docs)
        span = size + (start + size <= length)  # a piece cut off before its end-of-text token: one label more
        out = np.empty((len(pieces), 4), np.int64)
        out[:, _START] = ends[docs] - length + start
        out[:, _COUNT] = np.minimum(start + span, length) - start
        out[:, _EOS] = start + span > length
        out[:, _ROW] = row_of
        return out

    def rows(self, description: np.ndarray) -> np.ndarray:
        """The described rows, L + 1 positions each (int32 [B, L + 1]): the pieces' tokens (and end-of-text
        tokens) one after the other, IGNORE_INDEX after them."""
        count, eos, row = description[:, _COUNT], description[:, _EOS].astype(bool), description[:, _ROW]
        width = self.seq_len + 1
        out = np.full((int(row[-1]) + 1 if len(row) else 0, width), IGNORE_INDEX, np.int32)
        tokens = self.store.read_many(description[:, _START], count)
        span = count + eos
        before = np.cumsum(span) - span  # positions before each piece, all rows together
        first = np.flatnonzero(np.diff(row, prepend=-1))  # each row's first piece
        at = row * width + before - np.repeat(before[first], np.diff(np.append(first, len(row))))
        flat = out.reshape(-1)
        flat[np.repeat(at - (np.cumsum(count) - count), count) + np.arange(len(tokens))] = tokens
        flat[(at + count)[eos]] = self.eos_id
        return out

    def parts(self, description: np.ndarray) -> list[np.ndarray]:
        """A batch's hand-over: int32 arrays (`fastdata.text.forms`)."""
        return self.form.parts(self.rows(description))

    def to_batch(self, parts: list[torch.Tensor]) -> dict[str, torch.Tensor | int]:
        return self.form.batch(parts)

    def batch(self, epoch: int, rows: np.ndarray) -> dict[str, torch.Tensor | int]:
        """The batch of the epoch's rows `rows` (in this process)."""
        return self.to_batch([torch.from_numpy(part) for part in self.parts(self.describe(epoch, rows))])
