"""The tokenizer side of text datasets: load a `tokenizers` file for exact ids, pick the token dtype, and
find the end-of-text and padding tokens among the tokenizer's special tokens."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastdata.errors import ConfigError

#: End-of-text tokens recognised without --eos-token, in order of preference.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]", "<|im_end|>",
                  "<|eot_id|>", "[SEP]")
#: Padding tokens recognised for padded batches (the end-of-text token is used when none exists).
PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>", "<PAD>")


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """A `tokenizers.Tokenizer` from a `tokenizer.json` file, with the file's truncation and padding switched
    off so that `encode(text, add_special_tokens=False).ids` are a document's exact, whole ids."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: tokenizer file not found (expected a `tokenizers` tokenizer.json)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a plain Exception for any malformed file
        raise ConfigError(f"{path}: not a `tokenizers` tokenizer.json file ({exc})") from exc
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def vocab_size(tokenizer: Any) -> int:
    """Number of distinct ids the tokenizer can produce (added tokens included)."""
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's special added tokens: content -> id."""
    return {token.content: int(i) for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}


def _find(tokenizer: Any, candidates: tuple[str, ...]) -> tuple[str, int] | None:
    specials = special_tokens(tokenizer)
    for name in candidates:
        if name in specials:
            return name, specials[name]
    return None


def resolve_eos(tokenizer: Any, given: str | None, source: str) -> tuple[str, int] | None:
    """The end-of-text token (content, id): `given` if set (it must exist in the vocabulary), else the first
    of EOS_CANDIDATES among the special tokens, else None. `source` names the tokenizer in errors."""
    if given is not None:
        token_id = tokenizer.token_to_id(given)
        if token_id is None:
            raise ConfigError(f"{source}: end-of-text token {given!r} is not in the tokenizer's vocabulary")
        return given, int(token_id)
    return _find(tokenizer, EOS_CANDIDATES)


def resolve_pad(tokenizer: Any) -> tuple[str, int] | None:
    """The padding token (content, id) among the special tokens, or None."""
    return _find(tokenizer, PAD_CANDIDATES)
