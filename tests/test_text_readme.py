"""The text guide's snippets (```py blocks of docs/text.md) run as written, pointed at a tiny converted text
dataset: nothing is added to them (a snippet that uses a name it does not define fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from builders.text import make_corpus, train_bytelevel, write_jsonl

import fastdata

TEXT_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "text.md"


def text_section() -> str:
    return TEXT_GUIDE.read_text()


def text_blocks() -> list[str]:
    return re.findall(r"```py\n(.*?)```", text_section(), flags=re.S)


@pytest.fixture(scope="module")
def corpus_lmdb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme_text")
    docs = make_corpus(200, seed=9)
    tokenizer = train_bytelevel(root / "tokenizer.json", docs)
    out = root / "corpus.lmdb"
    fastdata.convert_text(
        write_jsonl(root / "corpus.jsonl", docs),
        out,
        tokenizer=tokenizer,
        options=fastdata.TextConversionOptions(progress=False),
    )
    assert fastdata.dataset(out).total_tokens > 1025  # at least one whole block of the guide's seq_len
    return out


def test_text_section_has_snippets_and_commands() -> None:
    assert len(text_blocks()) >= 2
    assert "fastdata convert text corpus.jsonl corpus.lmdb --tokenizer tokenizer.json" in text_section()


@pytest.mark.parametrize("index", range(len(text_blocks())))
def test_text_snippet_runs(index: int, corpus_lmdb: Path) -> None:
    code = text_blocks()[index].replace('"corpus.lmdb"', repr(str(corpus_lmdb)))
    namespace: dict = {}
    exec(compile(code, f"docs/text.md snippet {index}", "exec"), namespace)
    if "loss" in namespace:
        assert namespace["input_ids"].shape[1] == 1024 and torch.isfinite(namespace["loss"])
    if "text" in namespace:
        assert namespace["text"] == make_corpus(200, seed=9)[0]
