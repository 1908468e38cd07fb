"""Best-fit packing (`packing="best-fit"`): rows of exactly seq_len tokens holding whole documents, each followed by
its end-of-text token, padded; only documents a row cannot hold are cut, into row-sized pieces; every piece once
per epoch, nothing lost; labels the next token in the row (a cut row's last one the document's next token);
`loader.padding` what the rows hold; order from (seed, epoch) whatever the worker count. Resume and ranks:
test_text_loader_state.py."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from builders.text import write_jsonl
from contracts import clone

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.text.blocks import IGNORE_INDEX

EOS, PAD = 0, 1
SEQ_LEN = 32


def pieces_of(documents: list[list[int]], seq_len: int) -> Counter:
    """Each document and its end-of-text token, cut every seq_len tokens when a row cannot hold it."""
    pieces: Counter = Counter()
    for doc in documents:
        sequence = [*doc, EOS]
        pieces.update(tuple(sequence[at:at + seq_len]) for at in range(0, len(sequence), seq_len))
    return pieces


def segments_of(batches: list[dict]) -> list[tuple[tuple[int, ...], int]]:
    """Each row's tokens cut after every end-of-text token, with the label of the segment's last token."""
    found = []
    for batch in batches:
        for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"], strict=True):
            real = int(mask.sum())
            tokens = ids[:real].tolist()
            start = 0
            for at, token in enumerate(tokens):
                if token == EOS or at == real - 1:
                    found.append((tuple(tokens[start:at + 1]), int(labels[at])))
                    start = at + 1
    return found


@pytest.mark.parametrize("seq_len", [SEQ_LEN, 9])
def test_every_document_is_whole_once_per_epoch_and_only_long_ones_are_cut(loader_text, loader_documents, seq_len):
    loader = fastdata.loader(loader_text, batch_size=6, num_workers=2, seed=4,
                             text=fastdata.TextOptions(packing="best-fit", seq_len=seq_len))
    batches = [clone(b) for b in loader]
    assert len(batches) == len(loader)
    assert all(set(b) == {"input_ids", "attention_mask", "labels"} for b in batches)
    assert all(b["input_ids"].shape[1] == seq_len and b["input_ids"].dtype == torch.int64 for b in batches)
    segments = segments_of(batches)
    assert Counter(tokens for tokens, _ in segments) == pieces_of(loader_documents, seq_len)  # nothing lost, none twice
    whole = Counter(tuple([*doc, EOS]) for doc in loader_documents if len(doc) < seq_len)
    assert whole and all(Counter(t for t, _ in segments)[tokens] >= n for tokens, n in whole.items())
    cut = [doc for doc in loader_documents if len(doc) >= seq_len]
    assert cut and loader.batcher.pieces.cut_documents == len(cut)


def test_labels_are_the_next_token_of_the_row_and_padding_is_ignored(loader_text, loader_documents):
    loader = fastdata.loader(loader_text, batch_size=6, num_workers=0, seed=4,
                             text=fastdata.TextOptions(packing="best-fit", seq_len=SEQ_LEN))
    following = {}  # a cut piece -> its document's next token
    for doc in loader_documents:
        sequence = [*doc, EOS]
        for at in range(0, len(sequence) - SEQ_LEN, SEQ_LEN):
            following[tuple(sequence[at:at + SEQ_LEN])] = sequence[at + SEQ_LEN]
    continued = 0
    for batch in loader:
        for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"], strict=True):
            real = int(mask.sum())
            assert mask[:real].eq(1).all() and mask[real:].eq(0).all()
            assert ids[real:].eq(PAD).all() and labels[real:].eq(IGNORE_INDEX).all()
            assert torch.equal(labels[:real - 1], ids[1:real])
            if int(ids[real - 1]) == EOS:  # the row ends with a whole document: nothing of the row follows
                assert int(labels[real - 1]) == IGNORE_INDEX
            else:  # a row-sized piece of a cut document: its last label is the document's next token
                assert real == SEQ_LEN and int(labels[-1]) == following[tuple(ids.tolist())]
                continued += 1
    assert continued


def test_padding_is_what_the_rows_hold_and_less_than_next_fit(loader_text, loader_documents):
    loader = fastdata.loader(loader_text, batch_size=6, num_workers=0, seed=4,
                             text=fastdata.TextOptions(packing="best-fit", seq_len=SEQ_LEN))
    pads = positions = 0
    for batch in loader:
        pads += int((batch["attention_mask"] == 0).sum())
        positions += batch["attention_mask"].numel()
    assert loader.padding == pytest.approx(pads / positions)
    rows, room = 0, 0  # next-fit in source order: a piece that does not fit in the open row opens the next one
    sizes = [min(SEQ_LEN, len(doc) + 1 - at) for doc in loader_documents for at in range(0, len(doc) + 1, SEQ_LEN)]
    for size in sizes:
        if size > room:
            rows, room = rows + 1, SEQ_LEN
        room -= size
    next_fit = 1 - sum(len(doc) + 1 for doc in loader_documents) / (rows * SEQ_LEN)
    assert loader.padding < 0.02 < next_fit / 5
    assert fastdata.loader(loader_text, num_workers=0, text=fastdata.TextOptions(seq_len=SEQ_LEN)).padding == 0.0


def test_order_depends_on_seed_and_epoch_only(loader_text):
    def epochs(workers: int, seed: int = 7) -> list[list[dict]]:
        loader = fastdata.loader(loader_text, batch_size=5, num_workers=workers,
                                 seed=seed, text=fastdata.TextOptions(packing="best-fit", seq_len=SEQ_LEN))
        return [[clone(b) for b in loader] for _ in range(2)]

    serial, parallel = epochs(0), epochs(2)
    for a, b in zip(serial, parallel, strict=True):
        assert len(a) == len(b) and all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b, strict=True))
    assert not torch.equal(serial[0][0]["input_ids"], serial[1][0]["input_ids"])  # the next pass: the next epoch
    assert not torch.equal(epochs(0, seed=8)[0][0]["input_ids"], serial[0][0]["input_ids"])
    rows = [tuple(r.tolist()) for b in serial[0] for r in b["input_ids"]]
    unshuffled = fastdata.loader(loader_text, batch_size=5, num_workers=0,
                                 shuffle=False, text=fastdata.TextOptions(packing="best-fit", seq_len=SEQ_LEN))
    again = [tuple(r.tolist()) for b in unshuffled for r in b["input_ids"]]
    assert sorted(again) != again or sorted(rows) != rows  # shuffled rows, or at least not both sorted
    assert again == [tuple(r.tolist()) for b in unshuffled for r in b["input_ids"]]  # unshuffled: every epoch alike


def test_best_fit_options(loader_text):
    with pytest.raises(ConfigError, match="max_length: for padded batches"):
        fastdata.loader(loader_text, num_workers=0, text=fastdata.TextOptions(packing="best-fit", max_length=8))
    with pytest.raises(ConfigError, match="packing must be True, False or 'best-fit'"):
        fastdata.loader(loader_text, num_workers=0, text=fastdata.TextOptions(packing="best"))
    with pytest.raises(ConfigError, match="mixture"):
        fastdata.loader([loader_text, loader_text], weights=[1, 1], num_workers=0,
                        text=fastdata.TextOptions(packing="best-fit"))


def test_rows_are_planned_without_reading_a_token(tmp_path, loader_corpus, loader_tokenizer):
    """Rows are planned from the stored document lengths alone: over WebDataset shards whose token data is gone
    (their indexes kept), the loader plans its epoch (len, padding); only building a batch reads tokens."""
    out = tmp_path / "d"
    fastdata.convert_text(write_jsonl(tmp_path / "c.jsonl", loader_corpus), out, tokenizer=loader_tokenizer,
                          options=fastdata.TextConversionOptions(format="wds", shard_size="2KB", progress=False))
    for shard in out.glob("*.tar"):
        shard.write_bytes(b"")
    loader = fastdata.loader(out, batch_size=6, num_workers=0, text=fastdata.TextOptions(packing="best-fit",
                                                                                         seq_len=SEQ_LEN))
    assert len(loader) > 0 and 0 < loader.padding < 0.05
    with pytest.raises(CorruptSampleError, match="truncated"):
        next(iter(loader))


def test_loader_dataset_and_sampler_are_the_epochs_rows(loader_text):
    """As a DataLoader has them: `loader.dataset` the rows of the epoch (row i as a batch holds it, its boundaries
    too), `loader.sampler` this rank's rows of the epoch, in the order the batches take them."""
    loader = fastdata.loader(loader_text, batch_size=6,
                             num_workers=0, seed=4, text=fastdata.TextOptions(packing="best-fit", boundaries=True,
                                                                              seq_len=SEQ_LEN))
    loader.set_epoch(1)
    rows = [row for batch in loader for row in zip(batch["input_ids"], batch["position_ids"], strict=True)]
    loader.set_epoch(1)
    assert len(loader.dataset) == len(rows) == len(loader.sampler)
    assert list(loader.sampler) == list(range(len(rows)))
    for index in (0, len(rows) // 2, len(rows) - 1):
        row = loader.dataset[index]
        assert torch.equal(row["input_ids"], rows[index][0]) and torch.equal(row["position_ids"], rows[index][1])
        assert row["cu_seqlens"][0] == 0 and row["cu_seqlens"][-1] == SEQ_LEN and isinstance(row["max_seqlen"], int)
    assert loader.dataset.tokenizer is not None


def test_the_batches_of_an_item_carry_their_descriptions_once(loader_text):
    """The main process describes each worker item's batches in one go; the item carries the descriptions' two
    arrays once (pickled once), not two arrays per batch, and each batch's part of them is its own."""
    import pickle

    loader = fastdata.loader(loader_text, batch_size=3, num_workers=0,
                             text=fastdata.TextOptions(seq_len=SEQ_LEN, packing="best-fit"))
    batcher = loader.batcher
    batches = [np.array([7, 2, 5]), np.array([0, 8]), np.array([3, 1, 4, 6])]
    described = pickle.loads(pickle.dumps(batcher.describe_batches(0, batches)))
    assert all(d.pieces is described[0].pieces and d.held is described[0].held for d in described)
    for d, indices in zip(described, batches, strict=True):
        alone = batcher.describe(0, indices)
        assert d.rows == len(indices)
        assert all(np.array_equal(part, own) for part, own in zip(d.parts(), alone.parts(), strict=True))
