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

#: columns of a batch's pieces: the first token's place in the token stream, tokens read, whether the document's
#: end-of-text token follows them, and where the piece starts in the batch's rows (row * (L + 1) + column)
_START, _COUNT, _EOS, _PLACE = range(4)

#: A batch described for a worker: its pieces (int64 [pieces, 4]) and the positions each row holds (int64 [B])
Description = tuple[np.ndarray, np.ndarray]


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

    def describe(self, epoch: int, rows: np.ndarray) -> Description:
        """The epoch's rows `rows` as the token ranges they hold (main process): each piece of a document, and one
        position more for a piece its row ends inside of (the row's last label)."""
        plan = self.planner.plan(epoch) if self.planner is not None else None
        assert plan is not None, "described in the main process"
        pieces, row_of = plan.rows(rows)
        docs, start, size = self.pieces.locate(pieces)
        length = self.pieces.length_of(docs)
        span = size + (start + size <= length)  # a piece cut off before its end-of-text token: one label more
        before = np.cumsum(span) - span  # positions before each piece, all rows together ...
        first = np.searchsorted(row_of, np.arange(len(rows)))  # (each row's first piece)
        out = np.empty((len(pieces), 4), np.int64)
        out[:, _START] = self.pieces.ends[docs] - length + start
        out[:, _COUNT] = np.minimum(start + span, length) - start
        out[:, _EOS] = start + span > length
        out[:, _PLACE] = row_of * (self.seq_len + 1) + before - before[first][row_of]  # ... and in its row
        return out, np.bincount(row_of, weights=span, minlength=len(rows)).astype(np.int64)

    def rows(self, description: Description, out: np.ndarray | None = None) -> np.ndarray:
        """The described rows, L + 1 positions each (int32 [B, L + 1], or written into `out`): the pieces' tokens
        (and end-of-text tokens) one after the other, IGNORE_INDEX after them."""
        pieces, held = description
        width = self.seq_len + 1
        tokens = self.store.read_many(pieces[:, _START], pieces[:, _COUNT])
        out = np.empty((len(held), width), np.int32) if out is None else out
        out.fill(IGNORE_INDEX)
        places = np.arange(width) < held[:, None]  # each row's pieces from its start: their tokens, ...
        eos = pieces[pieces[:, _EOS].astype(bool)]
        at_eos = eos[:, _PLACE] + eos[:, _COUNT]
        places.reshape(-1)[at_eos] = False
        out[places] = tokens
        out.reshape(-1)[at_eos] = self.eos_id  # ... and after each document's last one its end-of-text token
        return out

    def transfer_shapes(self, description: Description) -> list[tuple[int, ...]]:
        """The int32 arrays a described batch hands over (`fastdata.text.forms`)."""
        return self.form.shapes(len(description[1]))

    def transfer(self, description: Description, parts: list[np.ndarray]) -> np.ndarray | None:
        """Write a described batch into its hand-over `parts` (int32 views into shared memory: the rows straight
        into the first); returns what travels beside it (`RowsForm.fill`)."""
        self.rows(description, parts[0])
        return self.form.fill(parts)

    def to_batch(self, parts: list[torch.Tensor], extra: np.ndarray | None = None) -> dict[str, torch.Tensor | int]:
        return self.form.batch(parts, extra)

    def batch(self, epoch: int, rows: np.ndarray) -> dict[str, torch.Tensor | int]:
        """The batch of the epoch's rows `rows`, built in this process."""
        description = self.describe(epoch, rows)
        parts = [np.empty(shape, np.int32) for shape in self.transfer_shapes(description)]
        extra = self.transfer(description, parts)
        return self.to_batch([torch.from_numpy(part) for part in parts], extra)
