"""Best-fit packed rows: each row exactly `seq_len` tokens of whole documents, each followed by its end-of-text
token, the rest padding; a document longer than a row is cut into row-sized pieces. The rows of an epoch are
planned from the stored document lengths alone (`fastdata.order.packing`, in the main process); the main process
describes each batch as the token ranges its rows hold and where they go, and a worker reads them into place (one
`read_into`).

The labels are the next token in the row, as for packed blocks: a document's last token has its end-of-text
token as its label, and an end-of-text token the next document's first token (IGNORE_INDEX where padding follows,
or with `mask_cross_document`). A row that ends inside a cut document has the document's next token as its last
label.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from fastdata.formats.tokens import TokenReader
from fastdata.order.packing import DEFAULT_WINDOW, Pieces, RowPlanner
from fastdata.text.boundaries import IGNORE_INDEX
from fastdata.text.forms import RowsForm

#: rows of a batch's pieces ([4, pieces], each row contiguous): the first token's place in the token stream, tokens
#: read, whether the document's end-of-text token follows them, and where the piece starts in the batch's rows
#: (row * (L + 1) + column)
_START, _COUNT, _EOS, _PLACE = range(4)



class Description(NamedTuple):
    """A batch described for a worker: its pieces, `pieces[:, piece_from:piece_to]` (int64 [4, pieces]), and the
    positions each of its rows holds, `held[row_from:row_to]` (int64 [B]). The batches of one worker item share
    the two arrays, so that the item carries (pickles) them once, not two arrays per batch."""

    pieces: np.ndarray
    held: np.ndarray
    piece_from: int
    piece_to: int
    row_from: int
    row_to: int

    def parts(self) -> tuple[np.ndarray, np.ndarray]:
        """This batch's pieces and its rows' held positions."""
        return self.pieces[:, self.piece_from:self.piece_to], self.held[self.row_from:self.row_to]

    @property
    def rows(self) -> int:
        return self.row_to - self.row_from


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
        return self.describe_batches(epoch, [rows])[0]

    def describe_batches(self, epoch: int, batches: list[np.ndarray]) -> list[Description]:
        """`describe` of each of several batches (each the epoch's rows it holds), all in the same few numpy passes:
        the main process describes every batch a worker is sent, so per batch this is a handful of operations."""
        plan = self.planner.plan(epoch) if self.planner is not None else None
        assert plan is not None, "described in the main process"
        pieces, row_of, row_first = plan.members(np.concatenate(batches))
        docs = self.pieces.document_of[pieces]
        ends = self.pieces.ends
        before_doc = np.where(docs > 0, ends[docs - 1], 0)  # the document's first token in the stream
        length = ends[docs] - before_doc
        start = (pieces - self.pieces.first[docs]) * self.seq_len
        size = np.minimum(self.seq_len, length + 1 - start)
        span = size + (start + size <= length)  # a piece cut off before its end-of-text token: one label more
        before = np.cumsum(span) - span  # positions before each piece, all rows together ...
        width = self.seq_len + 1
        sizes = [len(rows) for rows in batches]
        row_base = (np.arange(len(row_first)) - np.repeat(np.cumsum(sizes) - sizes, sizes)) * width - before[row_first]
        out = np.empty((4, len(pieces)), np.int64)
        np.add(before_doc, start, out=out[_START])
        np.subtract(np.minimum(start + span, length, out=out[_COUNT]), start, out=out[_COUNT])
        np.greater(start + span, length, out=out[_EOS])
        np.add(row_base[row_of], before, out=out[_PLACE])  # ... and in its row of its batch
        held = np.add.reduceat(span, row_first) if len(row_first) else np.zeros(0, np.int64)
        row_bounds = np.cumsum([0, *sizes]).tolist()
        piece_bounds = [*row_first[row_bounds[:-1]].tolist(), len(pieces)] if len(row_first) else [0] * len(row_bounds)
        return [Description(out, held, piece_bounds[k], piece_bounds[k + 1], row_bounds[k], row_bounds[k + 1])
                for k in range(len(batches))]

    def rows(self, description: Description, out: np.ndarray | None = None) -> np.ndarray:
        """The described rows, L + 1 positions each (int32 [B, L + 1], or written into `out`): the pieces' tokens
        (and end-of-text tokens) one after the other, IGNORE_INDEX after them. The pieces' tokens go straight to
        their places (one `read_into`); then the end-of-text tokens, the last label of every row that ends with
        one (one vectorised step), and the padding of the few rows not full."""
        pieces, held = description.parts()
        width = self.seq_len + 1
        out = np.empty((len(held), width), np.int32) if out is None else out
        flat = out.reshape(-1)
        self.store.read_into(flat, pieces[_START], pieces[_COUNT], pieces[_PLACE])
        eos = pieces[:, pieces[_EOS].astype(bool)]
        flat[eos[_PLACE] + eos[_COUNT]] = self.eos_id
        out[held == width - 1, -1] = IGNORE_INDEX  # most rows: full, their last label after an end-of-text token
        for row in np.flatnonzero(held < width - 1).tolist():  # the few rows with padding
            out[row, int(held[row]):] = IGNORE_INDEX
        return out

    def transfer_shapes(self, description: Description) -> list[tuple[int, ...]]:
        """The int32 arrays a described batch hands over (`fastdata.text.forms`)."""
        return self.form.shapes(description.rows)

    def transfer(self, description: Description, parts: list[np.ndarray]) -> np.ndarray | None:
        """Write a described batch into its hand-over `parts` (int32 views into shared memory: the rows straight
        into the first); returns what travels beside it (`RowsForm.fill`)."""
        self.rows(description, parts[0])
        return self.form.fill(parts)

    def to_batch(self, parts: list[np.ndarray], extra: np.ndarray | None = None) -> dict[str, torch.Tensor | int]:
        return self.form.batch(parts, extra)

    def batch(self, epoch: int, rows: np.ndarray) -> dict[str, torch.Tensor | int]:
        """The batch of the epoch's rows `rows`, built in this process."""
        description = self.describe(epoch, rows)
        parts = [np.empty(shape, np.int32) for shape in self.transfer_shapes(description)]
        extra = self.transfer(description, parts)
        return self.to_batch(parts, extra)
