"""A corpus of real English text from files already on the machine, and a byte-level BPE tokenizer trained on
part of it, for benchmarks/text_throughput.py (no network).

Sources, in this order, until the target size is reached: licence texts (/usr/share/common-licenses),
Python packages' descriptions and licences (site-packages METADATA, LICENSE, *.txt, *.rst, *.md), package
documentation (/usr/share/doc: READMEs, copyright files, HTML with its tags stripped), manual pages
(/usr/share/man, troff requests stripped), and last the packages' changelogs. Paragraphs seen before are
dropped (licence boilerplate repeats in hundreds of copyright files), files over 64 KB are cut into documents
at paragraph breaks.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import json
import os
import re
import site
import sys
from collections.abc import Iterator
from pathlib import Path

_MAX_DOC = 64_000
_TAGS = re.compile(r"<script.*?</script>|<style.*?</style>|<[^>]+>", re.S | re.I)
_TROFF = re.compile(r"\\f[BIRP]|\\-|\\\(..|\\&|\\e")
_PLAIN = (".txt", ".md", ".rst")
_NAMED = ("README", "NEWS", "AUTHORS", "copyright", "LICENSE", "LICENCE", "COPYING", "METADATA", "changelog")


def _read(path: Path) -> str | None:
    try:
        if path.suffix == ".gz":
            with gzip.open(path) as f:
                data = f.read()
        else:
            data = path.read_bytes()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def _wanted(name: str) -> bool:
    base = name[:-3] if name.endswith(".gz") else name
    return base.endswith(_PLAIN) or base.startswith(_NAMED) or base.endswith((".html", ".htm"))


def _clean(path: Path, text: str) -> str:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith((".html", ".htm")):
        text = html.unescape(_TAGS.sub(" ", text))
        text = re.sub(r"[ \t]+", " ", text)
    if "/man/" in str(path):
        lines = [_TROFF.sub("", line) for line in text.splitlines() if not line.startswith((".", "'"))]
        text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _is_changelog(name: str) -> bool:
    return name.lower().startswith("changelog")


def _candidate_files() -> Iterator[Path]:
    """Prose first (licences, package descriptions, documentation, manual pages), changelogs last."""
    doc, man = Path("/usr/share/doc"), Path("/usr/share/man")
    passes = [
        (Path("/usr/share/common-licenses"), lambda name: True),
        *((Path(p), _wanted) for p in site.getsitepackages()),
        (doc, lambda name: _wanted(name) and not _is_changelog(name)),
        (man, lambda name: name.endswith(".gz")),
        (doc, _is_changelog),
    ]
    seen: set[Path] = set()
    for root, wanted in passes:
        for dirpath, _dirs, files in sorted(os.walk(root)):
            for name in sorted(files):
                path = Path(dirpath, name)
                if path not in seen and not path.is_symlink() and wanted(name):
                    seen.add(path)
                    yield path


def _documents(text: str, seen: set[bytes]) -> Iterator[str]:
    """New paragraphs of `text`, grouped into documents of at most about _MAX_DOC characters."""
    current: list[str] = []
    size = 0
    for paragraph in text.split("\n\n"):
        key = hashlib.blake2b(paragraph.strip().encode(), digest_size=12).digest()
        if len(paragraph.strip()) < 40 or key in seen:
            continue
        seen.add(key)
        current.append(paragraph)
        size += len(paragraph)
        if size >= _MAX_DOC:
            yield "\n\n".join(current)
            current, size = [], 0
    if current:
        yield "\n\n".join(current)


def build_corpus(out: Path, target_mb: float) -> Path:
    """Write at least `target_mb` MB (UTF-8) of deduplicated English text as JSONL {"text": ...} to `out`,
    unless it is already there."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    seen: set[bytes] = set()
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for path in _candidate_files():
            text = _read(path)
            if not text:
                continue
            for doc in _documents(_clean(path, text), seen):
                line = json.dumps({"text": doc, "source": str(path)}, ensure_ascii=False)
                f.write(line + "\n")
                written += len(doc.encode())
            if written >= target_mb * 1e6:
                break
    if written < target_mb * 1e6:
        print(f"warning: only {written / 1e6:.1f} MB of text found on this machine", file=sys.stderr)
    tmp.rename(out)
    return out


def iter_texts(corpus: Path, limit_mb: float | None = None) -> Iterator[str]:
    total = 0
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            yield text
            total += len(text)
            if limit_mb is not None and total >= limit_mb * 1e6:
                return


def train_tokenizer(corpus: Path, out: Path, vocab_size: int = 32_000, train_mb: float = 16) -> Path:
    """A byte-level BPE tokenizer (GPT-2 style, `<|endoftext|>` special) trained on the first `train_mb` MB
    of the corpus, unless it is already there."""
    if out.is_file():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(iter_texts(corpus, train_mb), trainer)
    tok.save(str(out))
    return out


def corpus_and_tokenizer(data: Path, mb: float) -> tuple[Path, Path]:
    """The benchmarks' corpus of `mb` MB under `data` and its 32k byte-level BPE, each made once."""
    data.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(data / f"corpus-{mb:g}mb.jsonl", mb)
    return corpus, train_tokenizer(corpus, data / f"{corpus.stem}-bpe-32k.json")
