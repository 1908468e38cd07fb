"""The text loader: packed blocks cover the EOS-separated stream exactly once per epoch, labels shifted by
one; padded rows with masks; bucketing; order from (seed, epoch) whatever the worker count; both formats; damaged
data met by a worker raises its own message, and the loader can be replaced after it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from builders.damaged import damaged_text_copy
from builders.runs import REPLACE_AFTER_ERROR, run_python
from builders.text import reference_ids, train_bytelevel, write_jsonl

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.text.blocks import IGNORE_INDEX

EOS, PAD = 0, 1


@pytest.fixture
def data(loader_text) -> Path:
    return loader_text


@pytest.fixture
def documents(loader_documents) -> list[list[int]]:
    return loader_documents


@pytest.fixture
def corpus(loader_corpus) -> list[str]:
    return loader_corpus


def stream_of(documents: list[list[int]]) -> np.ndarray:
    return np.array([t for doc in documents for t in [*doc, EOS]], dtype=np.int64)


def rows(loader) -> list[dict[str, torch.Tensor]]:
    return [batch for batch in loader]


@pytest.mark.parametrize("seq_len", [7, 32])
def test_packed_blocks_cover_the_stream_exactly_once_per_epoch(data, documents, seq_len):
    stream = stream_of(documents)
    blocks = (len(stream) - 1) // seq_len
    loader = fastdata.loader(data, batch_size=5, num_workers=0, seed=1, text=fastdata.TextOptions(seq_len=seq_len))
    assert len(loader) == -(-blocks // 5)
    batches = rows(loader)
    assert len(batches) == len(loader)
    inputs = torch.cat([b["input_ids"] for b in batches]).numpy()
    labels = torch.cat([b["labels"] for b in batches]).numpy()
    assert inputs.shape == labels.shape == (blocks, seq_len) and inputs.dtype == np.int64
    assert set(batches[0]) == {"input_ids", "labels"}
    np.testing.assert_array_equal(inputs[:, 1:], labels[:, :-1])  # labels: the next token
    got = [tuple(row) for row in np.concatenate([inputs, labels[:, -1:]], axis=1).tolist()]
    expected = [tuple(stream[k * seq_len:k * seq_len + seq_len + 1].tolist()) for k in range(blocks)]
    assert Counter(got) == Counter(expected)  # every block once: every stream token but the first is a label once
    assert got != expected  # shuffled
    assert Counter(labels.ravel().tolist()) == Counter(stream[1:blocks * seq_len + 1].tolist())


def test_unshuffled_blocks_are_the_stream_in_order(data, documents):
    stream = stream_of(documents)
    loader = fastdata.loader(data, batch_size=4, shuffle=False, num_workers=0, drop_last=True,
                             text=fastdata.TextOptions(seq_len=16))
    inputs = torch.cat([b["input_ids"] for b in loader]).numpy()
    assert len(inputs) == ((len(stream) - 1) // 16) // 4 * 4
    np.testing.assert_array_equal(inputs.ravel(), stream[:inputs.size])


def test_order_depends_on_seed_and_epoch_only(data):
    def epochs(num_workers: int, passes: int = 2, **kw) -> list[list[torch.Tensor]]:
        loader = fastdata.loader(data, batch_size=6, num_workers=num_workers, seed=7,
                                 text=fastdata.TextOptions(seq_len=8), **kw)
        return [[b["input_ids"] for b in loader] for _ in range(passes)]

    serial, parallel = epochs(0), epochs(2)
    for a, b in zip(serial, parallel, strict=True):
        assert len(a) == len(b)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(serial[0], serial[1], strict=True))  # next pass, next epoch
    loader = fastdata.loader(data, batch_size=6, num_workers=0, seed=7, text=fastdata.TextOptions(seq_len=8))
    loader.set_epoch(1)
    assert loader.epoch == 1
    assert all(torch.equal(x, y) for x, y in zip([b["input_ids"] for b in loader], serial[1], strict=True))
    other_seed = fastdata.loader(data, batch_size=6, num_workers=0, seed=8, text=fastdata.TextOptions(seq_len=8))
    assert not torch.equal(next(iter(other_seed))["input_ids"], serial[0][0])


def test_padded_rows_masks_and_labels(data, documents):
    max_length = 12
    loader = fastdata.loader(data, batch_size=8, num_workers=2, seed=0, text=fastdata.TextOptions(packing=False,
                                                                                                  max_length=max_length))
    assert len(loader) == -(-len(documents) // 8)
    expected = Counter()
    for doc in documents:
        seq = [*doc, EOS][:max_length + 1]
        expected[(tuple(seq[:-1]), tuple(seq[1:]))] += 1
    got = Counter()
    for batch in loader:
        assert set(batch) == {"input_ids", "attention_mask", "labels"}
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        assert ids.shape == mask.shape == labels.shape and ids.dtype == mask.dtype == labels.dtype == torch.int64
        lengths = mask.sum(1)
        assert ids.shape[1] == max(1, int(lengths.max())) <= max_length
        for row in range(len(ids)):
            n = int(lengths[row])
            assert mask[row, :n].eq(1).all() and mask[row, n:].eq(0).all()
            assert ids[row, n:].eq(PAD).all() and labels[row, n:].eq(IGNORE_INDEX).all()
            got[(tuple(ids[row, :n].tolist()), tuple(labels[row, :n].tolist()))] += 1
    assert got == expected  # every document once per epoch, truncated, EOS as the last label


def test_length_bucketing_cuts_padding_and_keeps_every_document(data, documents):
    def padding(bucketing: bool | None = None) -> tuple[int, Counter]:
        loader = fastdata.loader(data, batch_size=8, num_workers=0, seed=2,
                                 text=fastdata.TextOptions(packing=False, max_length=64, bucketing=bucketing))
        pads, seen = 0, Counter()
        for batch in loader:
            pads += int((batch["attention_mask"] == 0).sum())
            for row, n in zip(batch["input_ids"], batch["attention_mask"].sum(1), strict=True):
                seen[tuple(row[:int(n)].tolist())] += 1
        return pads, seen

    plain_pads, plain_seen = padding()
    bucket_pads, bucket_seen = padding(bucketing=True)
    assert bucket_seen == plain_seen
    assert bucket_pads < plain_pads / 2
    a = [b["input_ids"] for b in fastdata.loader(data, batch_size=8, num_workers=2,
                                                 text=fastdata.TextOptions(packing=False, bucketing=True))]
    b = [b["input_ids"] for b in fastdata.loader(data, batch_size=8, num_workers=0,
                                                 text=fastdata.TextOptions(packing=False, bucketing=True))]
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_no_end_of_text_token(tmp_path, corpus):
    tokenizer = train_bytelevel(tmp_path / "t.json", corpus, vocab=300, specials=("<unk>",))
    out = tmp_path / "n.lmdb"
    summary = fastdata.convert_text(write_jsonl(tmp_path / "c.jsonl", corpus[:20]), out, tokenizer=tokenizer,
                                    options=fastdata.TextConversionOptions(progress=False))
    assert summary.eos is None and "packed loading needs --eos-token" in str(summary)
    with pytest.raises(ConfigError, match="--eos-token"):
        fastdata.loader(out, num_workers=0, text=fastdata.TextOptions(seq_len=8))
    padded = next(iter(fastdata.loader(out, batch_size=4, num_workers=0,
                                       shuffle=False, text=fastdata.TextOptions(packing=False, max_length=8))))
    assert padded["labels"][0, int(padded["attention_mask"][0].sum()) - 1] != IGNORE_INDEX
    packed = fastdata.loader(out, batch_size=4, num_workers=0, shuffle=False, text=fastdata.TextOptions(seq_len=8,
                                                                                                        eos_token="<unk>"))
    first = next(iter(packed))["input_ids"][0].tolist()
    assert first[:len(reference_ids(tokenizer, corpus[0]))] == reference_ids(tokenizer, corpus[0])[:8]

    given = tmp_path / "g.lmdb"
    fastdata.convert_text(write_jsonl(tmp_path / "c.jsonl", corpus[:20]), given, tokenizer=tokenizer,
                          options=fastdata.TextConversionOptions(eos_token="<unk>", progress=False))
    assert fastdata.dataset(given).eos_token_id == 0


def test_text_loader_option_errors(data):
    with pytest.raises(ConfigError, match="packing=False"):
        fastdata.loader(data, num_workers=0, text=fastdata.TextOptions(max_length=8))
    with pytest.raises(ConfigError, match="max_length"):
        fastdata.loader(data, num_workers=0, text=fastdata.TextOptions(packing=False, seq_len=8))
    with pytest.raises(ConfigError, match="no whole block"):
        fastdata.loader(data, num_workers=0, text=fastdata.TextOptions(seq_len=10**9))
    with pytest.raises(ConfigError, match="seq_len must be at least 1"):
        fastdata.loader(data, num_workers=0, text=fastdata.TextOptions(seq_len=0))


@pytest.mark.parametrize(("option", "value", "message"), [
    ("seq_len", "16", "seq_len must be an int, got '16' (str)"),
    ("max_length", 8.0, "max_length must be an int, got 8.0 (float)"),
    ("packing", "no", "packing must be True, False or 'best-fit', got 'no' (str)"),
    ("boundaries", 1, "boundaries must be True or False, got 1 (int)"),
    ("bucketing", 1, "bucketing must be True or False, got 1 (int)"),
    ("eos_token", 0, "eos_token must be a str (a token of the tokenizer), got 0 (int)"),
])
def test_text_options_of_the_wrong_type_are_one_line_config_errors(data, option, value, message):
    with pytest.raises(ConfigError) as info:
        fastdata.loader(data, num_workers=0, **{option: value})
    assert str(info.value) == message


def test_damaged_tokens_met_by_a_worker_raise_their_own_message(data, tmp_path):
    """With workers, the CorruptSampleError says what it says without them, in one line that starts with the
    dataset (LMDB) or the shard (WebDataset), not torch's "Caught CorruptSampleError in DataLoader worker process
    0. Original Traceback ..."."""
    damaged, start = damaged_text_copy(data, tmp_path)
    raised = {}
    for workers in (0, 2):
        with pytest.raises(CorruptSampleError) as info:
            for _ in fastdata.loader(damaged, batch_size=4, shuffle=False, num_workers=workers,
                                     text=fastdata.TextOptions(seq_len=16)):
                pass
        raised[workers] = str(info.value)
    assert raised[2] == raised[0]
    assert raised[2].startswith(start) and "\n" not in raised[2], raised[2]


def test_a_text_loader_replaced_after_it_raised_leaves_no_noise(data, tmp_path):
    """A user's program catches the error of a text loader with workers, makes a new loader and trains on:
    nothing on stderr (no "Exception ignored in ... can only test a child process" from the failed loader's
    workers)."""
    damaged, _ = damaged_text_copy(data, tmp_path)
    options = {"batch_size": 4, "shuffle": False, "num_workers": 2}
    text = fastdata.TextOptions(seq_len=16)
    with pytest.raises(CorruptSampleError) as info:
        for _ in fastdata.loader(damaged, text=text, **{**options, "num_workers": 0}):
            pass
    batches = len(fastdata.loader(data, text=text, **options))
    # the user's script, its options from JSON with the text options as their object
    made = "json.loads(sys.argv[3])\noptions['text'] = fastdata.TextOptions(**options['text'])\n"
    script = REPLACE_AFTER_ERROR.replace("json.loads(sys.argv[3])\n", made)
    assert script != REPLACE_AFTER_ERROR
    result = run_python(script, damaged, data, json.dumps({**options, "text": {"seq_len": 16}}))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [f"raised: {info.value}", f"pass 0 {batches}", f"pass 1 {batches}"]


def test_spawned_workers_give_the_same_batches(data):
    spawned = fastdata.loader(data, batch_size=8, num_workers=1, seed=4, multiprocessing_context="spawn",
                              text=fastdata.TextOptions(seq_len=16))
    serial = fastdata.loader(data, batch_size=8, num_workers=0, seed=4, text=fastdata.TextOptions(seq_len=16))
    a, b = list(spawned), list(serial)
    assert len(a) == len(b) == len(serial)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
        assert x["input_ids"].is_contiguous() and x["labels"].is_contiguous()


@pytest.mark.parametrize("packing", [True, "best-fit"])
def test_a_loader_dropped_without_close_is_freed_at_once(data, packing):
    """Nothing of a text loader refers back to it (its `dataset` sees its epoch through a weak reference): dropped
    without `close()`, it is freed, and its DataLoader ends its workers, at once, not at some later garbage
    collection (which may run in a process forked from this one). Its dataset outlives it, at the epoch it had."""
    import gc
    import weakref

    gc.disable()  # only reference counting frees it
    try:
        loader = fastdata.loader(data, num_workers=1, batch_size=4,
                                 text=fastdata.TextOptions(seq_len=8, packing=packing))
        for _ in loader:
            pass
        rows, dataset, ref = len(loader.dataset), loader.dataset, weakref.ref(loader)
        del loader
        assert ref() is None
        assert len(dataset) == rows and set(dataset[0]) >= {"input_ids", "labels"}
    finally:
        gc.enable()
