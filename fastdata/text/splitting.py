"""Cutting one huge document into pieces that tokenize, one after the other, into exactly the ids of the whole, so
that every core can take a piece: `encode(a + b).ids == encode(a).ids + encode(b).ids` for each cut.

A cut is made only where the tokenizer in use provably splits anyway, read from its `tokenizer.json`:

- the cut is before a single space that has a printable ASCII character (not a space) on each side, and no added
  token (special or not) occurs within a few characters of it, in the text or in its normalized form (an added token
  is matched before everything else and may take the whitespace around it);
- the normalizer works character by character (NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, BertNormalizer,
  Replace of a string that cannot match across the cut): it leaves the cut where it was, as one character (the
  space, or what a Replace made of it), never whitespace between the neighbours;
- the pre-tokenizer splits the text at that character, in a way that depends on no text beyond it: ByteLevel with
  its regex, a Split on a known GPT-2 / GPT-4 / Llama 3 / Qwen 2 regex or on that character, Whitespace,
  WhitespaceSplit, BertPreTokenizer, Metaspace, CharDelimiterSplit; in a Sequence, the members before the one that
  splits must leave the text around the cut alone (Digits, Punctuation, a split on another string), and those
  after must treat every piece alike (Metaspace prepending to the first piece only does not);
- the model tokenizes each pre-token on its own (BPE without dropout, WordPiece, WordLevel, Unigram).

For a tokenizer where this cannot be shown (no pre-tokenizer, a Prepend or Strip normalizer, a regex of its own...)
`reason` says why, and documents are tokenized whole.
"""

from __future__ import annotations

import itertools
import json
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

#: GPT-2's pre-tokenizer regex (ByteLevel's own)
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
#: GPT-4's (cl100k), which Llama 3 uses
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
#: Qwen 2's (single digits)
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
#: Split regexes known to split before a space that follows a non-space character, whatever comes after it: no
#: alternative matches a space after a non-space character, none looks behind, and the one lookahead, `(?!\S)`,
#: follows whitespace only.
KNOWN_SPLIT_REGEXES = frozenset({GPT2_REGEX, LLAMA3_REGEX, QWEN2_REGEX})
_PER_CHARACTER = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "BertNormalizer"})
_PER_PRETOKEN = frozenset({"BPE", "WordPiece", "WordLevel", "Unigram"})
_POST_PROCESSORS = frozenset({"ByteLevel", "TemplateProcessing", "BertProcessing", "RobertaProcessing"})
_CUT = re.compile(r"(?<=[!-~]) (?=[!-~])")  # a single space between printable ASCII characters
_SEARCH = 4096  # characters after a wanted cut searched for one that is safe, before giving up on that cut


class _Unsafe(Exception):
    """Why a component cannot be shown to keep the ids of a cut text."""


def _normalized_cut(normalizer: dict | None, cut: str) -> str:
    """The character the cut's space is once `normalizer` ran (raises _Unsafe when it may not stay one character
    between the same neighbours)."""
    if normalizer is None:
        return cut
    kind = normalizer.get("type")
    if kind == "Sequence":
        for member in normalizer.get("normalizers", []):
            cut = _normalized_cut(member, cut)
        return cut
    if kind in _PER_CHARACTER:
        return cut
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}), normalizer.get("content", "")
        if "String" not in pattern:
            raise _Unsafe("its normalizer replaces a regex")
        text = pattern["String"]
        if not text:
            raise _Unsafe("its normalizer replaces an empty string")
        if text == cut and len(content) == 1 and not content.isspace():
            return content
        if cut in text or not content or any(c.isspace() for c in content):
            raise _Unsafe(f"its normalizer replaces {text!r} by {content!r}")
        return cut
    raise _Unsafe(f"its normalizer has a {kind} step, which is not character by character")


def _splits_at(pre: dict, cut: str) -> bool:
    """True when `pre` splits the text at the cut character, depending on nothing beyond it; False when it leaves
    the text around the cut alone; raises _Unsafe otherwise."""
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("use_regex", True) and cut == " ":
            return True
        raise _Unsafe("its ByteLevel pre-tokenizer does not split by its regex" if cut == " " else
                      f"its normalizer makes spaces {cut!r}, which its ByteLevel pre-tokenizer does not split at")
    if kind == "Split":
        pattern, behavior = pre.get("pattern", {}), pre.get("behavior")
        if pre.get("invert"):
            raise _Unsafe("its Split pre-tokenizer is inverted")
        if "Regex" in pattern:
            if pattern["Regex"] in KNOWN_SPLIT_REGEXES and behavior == "Isolated" and cut == " ":
                return True
            raise _Unsafe("its Split pre-tokenizer has a regex of its own")
        text = pattern.get("String", "")
        if text == cut and behavior in ("Isolated", "Removed", "MergedWithNext", "Contiguous"):
            return True
        if text and cut not in text:
            return False
        raise _Unsafe(f"its Split pre-tokenizer on {text!r} may merge across the cut")
    if kind in ("Whitespace", "WhitespaceSplit", "BertPreTokenizer") and cut == " ":
        return True
    if kind == "Metaspace" and pre.get("split", True) and cut in (" ", pre.get("replacement", "\u2581")):
        return True
    if kind == "CharDelimiterSplit":
        return pre.get("delimiter") == cut
    if kind == "Digits" or (kind == "Punctuation" and pre.get("behavior") != "MergedWithNext"):
        return False
    raise _Unsafe(f"its {kind} pre-tokenizer does not split at a space on its own")


def _per_piece(pre: dict) -> None:
    """Raise _Unsafe unless `pre` treats every piece alike (it runs after the cut is a split)."""
    kind = pre.get("type")
    if kind == "Metaspace" and pre.get("prepend_scheme") == "first":
        raise _Unsafe("its Metaspace pre-tokenizer prepends to the first piece only")
    known = {"ByteLevel", "Split", "Whitespace", "WhitespaceSplit", "BertPreTokenizer", "Metaspace",
             "CharDelimiterSplit", "Digits", "Punctuation", "UnicodeScripts"}
    if kind not in known:
        raise _Unsafe(f"its {kind} pre-tokenizer is not known to treat every piece alike")


def _check_pre_tokenizer(pre: dict | None, cut: str) -> None:
    if pre is None:
        raise _Unsafe("it has no pre-tokenizer (the whole text is one word)")
    members = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    for number, member in enumerate(members):
        if member.get("type") == "Sequence":
            raise _Unsafe("its pre-tokenizer nests sequences")
        if _splits_at(member, cut):
            for after in members[number + 1:]:
                _per_piece(after)
            return
    raise _Unsafe("its pre-tokenizer does not split at a space")


def split_reason(config: dict) -> str | None:
    """None when cutting before a space (as `DocumentSplitter` cuts) keeps the ids of the tokenizer described by
    `config` (its tokenizer.json, parsed), else why it cannot be shown."""
    try:
        model = config.get("model") or {}
        if model.get("type") not in _PER_PRETOKEN:
            raise _Unsafe(f"its {model.get('type')} model is not known to tokenize each word on its own")
        if model.get("dropout"):
            raise _Unsafe("its BPE model has dropout (the ids are random)")
        post = config.get("post_processor")
        kinds = [m.get("type") for m in post.get("processors", [])] if post and post.get("type") == "Sequence" \
            else [post.get("type")] if post else []
        unknown = [kind for kind in kinds if kind not in _POST_PROCESSORS]
        if unknown:
            raise _Unsafe(f"its {unknown[0]} post-processor is not known")
        _check_pre_tokenizer(config.get("pre_tokenizer"), _normalized_cut(config.get("normalizer"), " "))
    except _Unsafe as exc:
        return str(exc)
    return None


@dataclass
class DocumentSplitter:
    """Cuts documents longer than `piece_chars` into pieces of about that many characters, where `split_reason`
    shows the tokenizer's ids are kept (`reason` None); with a reason, never cuts, and counts the documents it
    would have cut (`kept_whole`)."""

    tokenizer: Any
    piece_chars: int
    reason: str | None = None
    added: list[str] = field(default_factory=list)  # the added tokens' contents
    reach: int = 0  # characters around a cut in which no added token may occur
    split_documents: int = 0
    pieces_made: int = 0
    kept_whole: int = 0

    @classmethod
    def of(cls, tokenizer: Any, piece_chars: int) -> DocumentSplitter:
        reason = split_reason(json.loads(tokenizer.to_str()))
        added = sorted({token.content for token in tokenizer.get_added_tokens_decoder().values() if token.content})
        return cls(tokenizer, piece_chars, reason, added, 2 + max((len(a) for a in added), default=0))

    def _clear(self, text: str, at: int) -> bool:
        """No added token within `reach` characters of a cut at `at`, in the text or once normalized (each side
        normalized on its own: the normalizer leaves the cut alone)."""
        if not self.added:
            return True
        reach = self.reach
        window = text[max(0, at - reach):at + reach]
        if any(token in window for token in self.added):
            return False
        normalize = self.tokenizer.normalizer.normalize_str if self.tokenizer.normalizer is not None else None
        if normalize is None:
            return True
        width = 4 * reach
        while True:  # wide enough that each side keeps `reach` characters once normalized (or is all there is)
            left, right = normalize(text[max(0, at - width):at]), normalize(text[at:at + width])
            if (len(left) >= reach or width >= at) and (len(right) >= reach or at + width >= len(text)):
                break
            width *= 2
        window = left[-reach:] + right[:reach]
        return not any(token in window for token in self.added)

    def cuts(self, text: str) -> list[int]:
        """Where to cut `text` (positions, increasing; empty: keep it whole)."""
        if len(text) <= self.piece_chars:
            return []
        if self.reason is not None:
            self.kept_whole += 1
            if self.kept_whole == 1:
                warnings.warn(f"a document of {len(text):,} characters is tokenized whole, on one core: cutting it "
                              f"cannot be shown to keep this tokenizer's ids ({self.reason})", stacklevel=2)
            return []
        cuts: list[int] = []
        at = self.piece_chars
        while at < len(text) - self.piece_chars // 4:  # no last piece much shorter than the others
            found = _CUT.search(text, at, min(len(text), at + _SEARCH))
            while found is not None and not self._clear(text, found.start()):
                found = _CUT.search(text, found.start() + 1, min(len(text), at + _SEARCH))
            if found is not None:
                cuts.append(found.start())
                at = found.start() + self.piece_chars
            else:
                at += _SEARCH
        return cuts

    def pieces(self, text: str) -> list[str]:
        """`text` cut where `cuts` says (a list of one when it is kept whole)."""
        cuts = self.cuts(text)
        if not cuts:
            return [text]
        self.split_documents += 1
        self.pieces_made += len(cuts) + 1
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in itertools.pairwise(bounds)]
