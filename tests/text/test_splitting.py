"""Cutting a huge document for parallel tokenizing (fastdata.text.splitting): for every tokenizer kind where the
cut is shown safe, the pieces' ids joined are exactly one whole encode's, added tokens (one taking the spaces
around it) and unicode included; where it cannot be shown (Llama 2's Prepend normalizer, no pre-tokenizer, a regex
of its own...) the document is kept whole, said once, and cutting it would indeed have changed the ids."""

from __future__ import annotations

import json
import warnings

import pytest
from builders.text import TOKENIZER_KINDS, train_tokenizer, tricky_text

from fastdata.text.splitting import DocumentSplitter, split_reason
from fastdata.text.tokenizer import load_tokenizer

SAFE = [kind for kind in TOKENIZER_KINDS if kind != "llama2-prepend"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("split_tokenizers")
    texts = [tricky_text(300, seed) for seed in range(40)]
    return {kind: load_tokenizer(train_tokenizer(root / f"{kind}.json", texts, kind)) for kind in TOKENIZER_KINDS}


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("kind", SAFE)
def test_pieces_tokenize_to_the_ids_of_the_whole(tokenizers, kind):
    tokenizer = tokenizers[kind]
    splitter = DocumentSplitter.of(tokenizer, piece_chars=200)
    assert splitter.reason is None
    for seed in range(100, 140):
        text = tricky_text(2000, seed)
        pieces = splitter.pieces(text)
        assert "".join(pieces) == text and len(pieces) > 10
        assert [i for piece in pieces for i in ids(tokenizer, piece)] == ids(tokenizer, text), f"text {seed}"
    assert splitter.split_documents == 40 and splitter.kept_whole == 0


def test_no_cut_near_an_added_token(tokenizers):
    """`<mask>` takes the spaces on both sides and `<|endoftext|>` is matched before the pre-tokenizer runs: a cut
    beside either would change the ids, so no cut is made within reach of one."""
    splitter = DocumentSplitter.of(tokenizers["bytelevel"], piece_chars=10)
    text = "alpha beta <mask> gamma delta<|endoftext|> epsilon zeta eta theta iota kappa lambda mu nu xi omicron"
    for cut in splitter.cuts(text):
        near = text[cut - splitter.reach:cut + splitter.reach]
        assert "<mask>" not in near and "<|endoftext|>" not in near
    assert splitter.cuts(text)


def test_a_tokenizer_that_cannot_be_shown_safe_keeps_documents_whole_and_says_so_once(tokenizers):
    tokenizer = tokenizers["llama2-prepend"]
    splitter = DocumentSplitter.of(tokenizer, piece_chars=200)
    assert splitter.reason == "its normalizer has a Prepend step, which is not character by character"
    texts = [tricky_text(1000, seed) for seed in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert all(splitter.pieces(text) == [text] for text in texts)
    assert [str(w.message) for w in caught] == [
        f"a document of {len(texts[0]):,} characters is tokenized whole, on one core: cutting it cannot be shown to "
        "keep this tokenizer's ids (its normalizer has a Prepend step, which is not character by character)"]
    assert splitter.kept_whole == 3 and splitter.pieces("short") == ["short"] and splitter.kept_whole == 3
    forced = DocumentSplitter.of(tokenizers["bytelevel"], piece_chars=200)  # the cuts a safe tokenizer would take
    pieces = forced.pieces(texts[0])
    assert [i for piece in pieces for i in ids(tokenizer, piece)] != ids(tokenizer, texts[0])  # the refusal matters


def config(**parts) -> dict:
    base = {"normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "post_processor": None, "model": {"type": "BPE", "dropout": None}}
    return {**base, **parts}


@pytest.mark.parametrize(("parts", "reason"), [
    ({}, None),
    ({"normalizer": {"type": "Strip", "strip_left": True, "strip_right": True}},
     "its normalizer has a Strip step, which is not character by character"),
    ({"normalizer": {"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}},
     "its normalizer replaces a regex"),
    ({"normalizer": {"type": "Replace", "pattern": {"String": "a b"}, "content": "x"}},
     "its normalizer replaces 'a b' by 'x'"),
    ({"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}},
     "its normalizer makes spaces '\u2581', which its ByteLevel pre-tokenizer does not split at"),
    ({"pre_tokenizer": None}, "it has no pre-tokenizer (the whole text is one word)"),
    ({"pre_tokenizer": {"type": "ByteLevel", "use_regex": False}},
     "its ByteLevel pre-tokenizer does not split by its regex"),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"\w+|\s"}, "behavior": "Isolated", "invert": False}},
     "its Split pre-tokenizer has a regex of its own"),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                        "invert": False}}, "its Split pre-tokenizer on ' ' may merge across the cut"),
    ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"}]}},
     "its Metaspace pre-tokenizer prepends to the first piece only"),
    ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits"}, {"type": "WhitespaceSplit"},
                                                              {"type": "ByteLevel", "use_regex": False}]}}, None),
    ({"pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False}},
     "its Metaspace pre-tokenizer does not split at a space on its own"),
    ({"model": {"type": "BPE", "dropout": 0.1}}, "its BPE model has dropout (the ids are random)"),
    ({"post_processor": {"type": "Unknown"}}, "its Unknown post-processor is not known"),
])
def test_split_reason(parts, reason):
    assert split_reason(config(**parts)) == reason


def test_the_tokenizers_built_for_the_tests_are_what_they_say(tokenizers):
    kinds = {kind: json.loads(tok.to_str()) for kind, tok in tokenizers.items()}
    assert kinds["llama3-split"]["pre_tokenizer"]["pretokenizers"][0]["type"] == "Split"
    assert kinds["wordpiece"]["model"]["type"] == "WordPiece" and kinds["unigram-metaspace"]["model"]["type"] == \
        "Unigram"
    assert any(t["content"] == "<mask>" and t["lstrip"] and t["rstrip"] for t in kinds["bytelevel"]["added_tokens"])
