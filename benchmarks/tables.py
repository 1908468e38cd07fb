"""The READMEs' benchmark tables, written from the results the harness keeps (`benchmarks/results/*.json`).

In README.md, benchmarks/README.md and docs/images.md each generated table sits between two comments:

    <!-- results: convert.json convert_speed 0 -->
    | contender | images/s | x (a) |
    ...
    <!-- /results -->

naming the results file, the benchmark and which of its tables (0: the first it made); a block between
`<!-- registry -->` and `<!-- /registry -->` is the list of every benchmark (`registry.BENCHMARKS`). `python -m
benchmarks tables` rewrites every such block from its source; `--check` (and tests/test_benchmark_tables.py)
fails when a block and its results differ, so a figure in a README is always one the harness recorded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOCUMENTS = (HERE.parent / "README.md", HERE / "README.md", HERE.parent / "docs" / "images.md")
_BLOCK = re.compile(r"(<!-- results: (\S+) (\S+) (\d+) -->\n)(.*?)(<!-- /results -->)", re.DOTALL)
_REGISTRY = re.compile(r"(<!-- registry -->\n)(.*?)(<!-- /registry -->)", re.DOTALL)


def registry_table() -> str:
    """Every benchmark: its suite, the command of its full run, what it compares."""
    from registry import BENCHMARKS
    from report import Table

    def command(b) -> str:
        target = " ".join(b.command) if b.command else b.file
        return f"`{' '.join([target, *b.args])}`"

    rows = [(b.suite, b.name, command(b), b.about + (f" (needs {', '.join(b.needs)})" if b.needs else ""))
            for b in BENCHMARKS]
    return Table("", ("suite", "benchmark", "its full run", "what it compares"), tuple(rows), "llll").markdown()


def _table(file: str, benchmark: str, index: int, cache: dict[str, dict]) -> str:
    """The Markdown of table `index` of `benchmark`'s run in results file `file`."""
    from report import Table

    if file not in cache:
        path = RESULTS / file
        if not path.exists():
            raise ValueError(f"benchmarks/results/{file} does not exist")
        cache[file] = json.loads(path.read_text(encoding="utf-8"))
    runs = [r for r in cache[file]["runs"] if r["benchmark"] == benchmark]
    if not runs:
        raise ValueError(f"benchmarks/results/{file} has no run of {benchmark}")
    tables = runs[-1]["tables"]
    if index >= len(tables):
        raise ValueError(f"benchmarks/results/{file}: {benchmark} made {len(tables)} tables, not {index + 1}")
    return Table.from_json(tables[index]).markdown()


def render(text: str, cache: dict[str, dict] | None = None) -> str:
    """`text` with every results block written from its results."""
    cache = {} if cache is None else cache

    def block(match: re.Match) -> str:
        opening, file, benchmark, index = match.group(1), match.group(2), match.group(3), int(match.group(4))
        return f"{opening}{_table(file, benchmark, index, cache)}\n{match.group(6)}"

    text = _BLOCK.sub(block, text)
    return _REGISTRY.sub(lambda m: f"{m.group(1)}{registry_table()}\n{m.group(3)}", text)


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(results file, benchmark, table index) of every results block in `text`."""
    return [(m.group(2), m.group(3), int(m.group(4))) for m in _BLOCK.finditer(text)]


def update(documents: tuple[Path, ...]) -> list[Path]:
    """Rewrite the results blocks of `documents`; the documents that changed."""
    changed = []
    for path in documents:
        text = path.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def check(documents: tuple[Path, ...]) -> list[str]:
    """Where `documents` and their results differ: one line per block that differs (empty: none)."""
    drift = []
    for path in documents:
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            try:
                expected = _table(match.group(2), match.group(3), int(match.group(4)), {})
            except ValueError as exc:
                drift.append(f"{path.name}: {exc}")
                continue
            if match.group(5).rstrip("\n") != expected:
                drift.append(f"{path.name}: the table of {match.group(3)} #{match.group(4)} from "
                             f"{match.group(2)} differs from its results (python -m benchmarks tables)")
        for match in _REGISTRY.finditer(text):
            if match.group(2).rstrip("\n") != registry_table():
                drift.append(f"{path.name}: the list of benchmarks differs from benchmarks/registry.py "
                             "(python -m benchmarks tables)")
    return drift
