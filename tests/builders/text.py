"""Text corpora and tokenizers: every corpus document names its index ("doc 17 ..."), so that order mistakes
show in the decoded text; tokenizers are trained with the `tokenizers` trainer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "data", "loader", "token", "block")
UNICODE = ["日本語のテキストと中文文本", "emoji 🎉🚀👩‍👩‍👧 end", "combining e\u0301 a\u0308 n\u0303 Å",
           "tab\tand\nnewline\r\n"]


def make_corpus(count: int = 120, seed: int = 0) -> list[str]:
    """Documents of varied length (some empty), with unicode; document i starts with `doc i`."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(count):
        if i % 17 == 5:
            docs.append("")
            continue
        words = " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), int(rng.integers(0, 60))))
        extra = UNICODE[i % len(UNICODE)] if i % 3 == 0 else ""
        docs.append(f"doc {i}: {words} {extra}".rstrip())
    return docs


def train_bytelevel(path: Path, texts: list[str], vocab: int = 400, specials=("<|endoftext|>", "<pad>")) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


#: Pieces of text that tokenizers treat specially: added tokens (special or not, one taking the spaces around it),
#: contractions, digits, combining and compatibility characters, whitespace runs, scripts without spaces.
TRICKY = ("the", "cat", "don't", "I'll", "x=1;", "12345", "3.14", "naïve", "café", "e\u0301", "日本語", "—", "...",
          "(a)", "<|endoftext|>", "[SEP]", "<mask>", "foo's", "ВОДА", "?!", "a\u00a0b", "ﬁ", "İstanbul", "🎉")


def tricky_text(words: int, seed: int) -> str:
    """Text of `words` TRICKY pieces, mostly single spaces between them, sometimes none, several or newlines."""
    rng = np.random.default_rng(seed)
    gaps = (" ", " ", " ", " ", "", "\n", "  ", "\n\n", "\t")
    return "".join(TRICKY[i] + gaps[g] for i, g in zip(rng.integers(0, len(TRICKY), words),
                                                        rng.integers(0, len(gaps), words), strict=True))


#: The tokenizer kinds `train_tokenizer` builds (offline, trained on the texts given).
TOKENIZER_KINDS = ("bytelevel", "bytelevel-prefix", "gpt2-split", "llama3-split", "qwen2-split", "wordpiece",
                   "unigram-metaspace", "replace-metaspace", "llama2-prepend")


def train_tokenizer(path: Path, texts: list[str], kind: str) -> Path:
    """A small tokenizer of one of TOKENIZER_KINDS trained on `texts`, with the special tokens `<|endoftext|>`,
    `[SEP]`, `[UNK]`, `<unk>` and the added token `<mask>` (which takes the spaces on both sides), saved to `path`:
    byte-level BPE as GPT-2's (with or without a prefix space), byte-level BPE behind a Split on GPT-2's, GPT-4 /
    Llama 3's or Qwen 2's regex, BERT's WordPiece, a Unigram with a Metaspace pre-tokenizer, a BPE whose normalizer
    makes spaces "▁" before a Metaspace, and Llama 2's layout (a Prepend normalizer, no pre-tokenizer)."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pre

    from fastdata.text.splitting import GPT2_REGEX, LLAMA3_REGEX, QWEN2_REGEX

    specials = ["<|endoftext|>", "[SEP]", "[UNK]", "<unk>"]
    alphabet = pre.ByteLevel.alphabet()
    bpe = dict(vocab_size=500, special_tokens=specials, show_progress=False)
    regexes = {"gpt2-split": GPT2_REGEX, "llama3-split": LLAMA3_REGEX, "qwen2-split": QWEN2_REGEX}
    if kind in ("bytelevel", "bytelevel-prefix"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=kind == "bytelevel-prefix")
        trainer = trainers.BpeTrainer(initial_alphabet=alphabet, **bpe)
    elif kind in regexes:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre.Sequence([pre.Split(Regex(regexes[kind]), "isolated"),
                                          pre.ByteLevel(add_prefix_space=False, use_regex=False)])
        trainer = trainers.BpeTrainer(initial_alphabet=alphabet, **bpe)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    elif kind == "unigram-metaspace":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>",
                                          show_progress=False)
    elif kind == "replace-metaspace":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre.Metaspace(prepend_scheme="never")
        trainer = trainers.BpeTrainer(**bpe)
    elif kind == "llama2-prepend":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        trainer = trainers.BpeTrainer(**bpe)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True)])
    tok.save(str(path))
    return path


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({field: doc, "id": len(doc)}, ensure_ascii=False) + "\n")
    return path


def reference_ids(tokenizer_file: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.no_truncation()
    tok.no_padding()
    return tok.encode(text, add_special_tokens=False).ids
