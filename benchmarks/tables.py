"""The documents' figures, written from the results the harness keeps (`benchmarks/results/*.json`).

Every measured figure of README.md, docs/ and benchmarks/README.md sits between two HTML comments (invisible on
GitHub and in the built docs) that name where it comes from; `python -m benchmarks tables` writes what is between
them, and `--check` (and tests/test_benchmark_tables.py) fails when a document and its results differ:

    <!-- results: FILE BENCHMARK TABLE -->              a whole table, its notes and a caption naming the
    ...                                                 machine, the date and the command that measured it
    <!-- /results -->
    <!-- output: FILE BENCHMARK TABLE -->               what a command printed (a code block), with its caption
    ...
    <!-- /output -->
    <!-- fig: FILE BENCHMARK TABLE ROW COLUMN -->2.73x<!-- /fig -->            one cell, in prose
    <!-- fig: FILE BENCHMARK TABLE ROW COLUMN / ROW COLUMN -->2.41x<!-- /fig -->   the ratio of two cells
    <!-- measured: FILE BENCHMARK -->...<!-- /measured -->     where BENCHMARK's run in FILE was measured
    <!-- registry -->...<!-- /registry -->              the list of every benchmark (`registry.BENCHMARKS`)

FILE is a file of benchmarks/results/; TABLE the index of a table of the run (0: the first it made) or a part of
its title; ROW an index or the text of the row's first cell; COLUMN an index or the column's name; text with
spaces in "quotes". A figure in prose has, in the same section (between two headings), a `measured` caption or
a table of the same run, so that every figure shown names its machine. benchmarks/guard.py fails on a measured
figure written anywhere else.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from benchmarks.provenance import Broken, Pending, Results, Run, cell, ratio
from benchmarks.registry import BENCHMARKS
from benchmarks.report import Table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCUMENTS = (ROOT / "README.md", HERE / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
#: a block marker (on a line of its own; what it holds starts with a newline) or an inline one (on one line); a
#: marker written in inline code (after a backquote) is an example of the syntax, not a marker
MARKER = re.compile(r"(?<!`)<!-- (?:(results|output|registry)(?:: ([^\n]*?))? -->(\n.*?)<!-- /\1 -->"
                    r"|(fig|measured): ([^\n]*?) -->([^\n]*?)<!-- /\4 -->)", re.DOTALL)
_HEADING = re.compile(r"^#{1,6} ", re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_MEASURED = "(not measured yet)"
BLOCKS = ("results", "output", "registry")


@dataclass(frozen=True)
class Marker:
    """One marker of a document: its kind, what it names, its content and where it starts."""

    kind: str
    spec: str
    content: str
    start: int
    span: tuple[int, int]  # where its content lies in the document

    def args(self) -> list[str | int]:
        try:
            return [int(t) if t.isdigit() else t for t in shlex.split(self.spec or "")]
        except ValueError as exc:
            raise Broken(f"cannot read {self.spec!r}: {exc}") from exc

    def source(self) -> tuple[str, str]:
        """(results file, benchmark) it is taken from."""
        args = self.args()
        if len(args) < 2 or not all(isinstance(a, str) for a in args[:2]):
            raise Broken(f"<!-- {self.kind}: {self.spec} --> names no FILE BENCHMARK")
        return args[0], args[1]


def _marker(match: re.Match) -> Marker:
    block = match.group(1) is not None
    kind, spec, content = match.group(*((1, 2, 3) if block else (4, 5, 6)))
    return Marker(kind, spec or "", content, match.start(), match.span(3 if block else 6))


def markers(text: str) -> list[Marker]:
    return [_marker(m) for m in MARKER.finditer(text)]


def blocks(text: str) -> list[tuple[str, str, int | str]]:
    """(results file, benchmark, table) of every results block in `text`."""
    return [(*m.source(), m.args()[2]) for m in markers(text) if m.kind == "results"]


def registry_table() -> str:
    """Every benchmark: its suite, the command of its full run, what it compares."""

    def command(b) -> str:
        return f"`{' '.join(['python', *b.target, *b.args])}`"

    rows = [(b.suite, b.name, command(b), b.about + (f" (needs {', '.join(b.needs)})" if b.needs else ""))
            for b in BENCHMARKS]
    return Table("", ("suite", "benchmark", "its full run", "what it compares"), tuple(rows), "llll").markdown()


def caption(run: Run) -> str:
    text = run.provenance()
    return f"*{text[0].upper()}{text[1:]}.*"


def _table_block(table: Table, run: Run) -> str:
    notes = "".join(f"- {note}\n" for note in table.notes)
    return f"{table.markdown()}\n\n{notes}{chr(10) if notes else ''}{caption(run)}"


def _output_block(table: Table, run: Run) -> str:
    lines = "\n".join(row[0] for row in table.rows)
    return f"```\n{lines}\n```\n\n{caption(run)}"


def expected(marker: Marker, results: Results) -> tuple[str, bool]:
    """What `marker` holds when written from `results`, and whether that is a figure not measured yet (Broken:
    it names what does not exist)."""
    try:
        return _content(marker, results), False
    except Pending as exc:
        if marker.kind == "fig":
            return NOT_MEASURED, True
        text = str(exc)
        return (text if marker.kind == "measured" else f"\n*{text[0].upper()}{text[1:]}.*\n"), True


def _content(marker: Marker, results: Results) -> str:
    if marker.kind == "registry":
        return f"\n{registry_table()}\n"
    file, benchmark = marker.source()
    args = marker.args()
    if marker.kind == "measured":
        if len(args) != 2:
            raise Broken(f"<!-- measured: {marker.spec} --> takes FILE BENCHMARK")
        return results.run(file, benchmark).provenance(short=True)
    if marker.kind in ("results", "output"):
        if len(args) != 3:
            raise Broken(f"<!-- {marker.kind}: {marker.spec} --> takes FILE BENCHMARK TABLE")
        run, table = results.table(file, benchmark, args[2])
        return f"\n{(_table_block if marker.kind == 'results' else _output_block)(table, run)}\n"
    if len(args) not in (5, 8) or (len(args) == 8 and args[5] != "/"):
        raise Broken(f"<!-- fig: {marker.spec} --> takes FILE BENCHMARK TABLE ROW COLUMN [/ ROW COLUMN]")
    _, table = results.table(file, benchmark, args[2])
    value = cell(table, args[3], args[4])
    return ratio(value, cell(table, args[6], args[7])) if len(args) == 8 else value


def sections(text: str) -> list[tuple[int, int]]:
    """(start, end) of each section of `text`: from a heading (outside code blocks) to the next."""
    fenced = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    starts = [m.start() for m in _HEADING.finditer(text) if not any(a <= m.start() < b for a, b in fenced)]
    bounds = [0, *starts, len(text)]
    return list(itertools.pairwise(bounds))


def uncaptioned(text: str) -> list[Marker]:
    """The figures of `text` whose section shows no caption (a results or output block or a `measured` marker)
    of the run they come from."""
    found = markers(text)
    missing = []
    for start, end in sections(text):
        inside = [m for m in found if start <= m.start < end]
        captioned = {m.source() for m in inside if m.kind in ("results", "output", "measured")}
        missing += [m for m in inside if m.kind == "fig" and m.source() not in captioned]
    return missing


def render(text: str, results: Results | None = None) -> str:
    """`text` with every marker written from `results` (Broken, naming every such marker: one names what does not
    exist)."""
    results = results or Results()
    out, last, broken = [], 0, []
    for marker in markers(text):
        try:
            out += [text[last:marker.span[0]], expected(marker, results)[0]]
        except Broken as exc:
            broken.append(f"line {text.count(chr(10), 0, marker.start) + 1}: <!-- {marker.kind}: {marker.spec} -->: "
                          f"{exc}")
            out.append(text[last:marker.span[1]])
        last = marker.span[1]
    if broken:
        raise Broken("\n".join(broken))
    return "".join(out) + text[last:]


def update(documents: tuple[Path, ...], results: Results | None = None) -> list[Path]:
    """Rewrite the markers of `documents`; the documents that changed. A marker that names what does not exist
    stops it before any document is written (Broken, naming every such marker)."""
    results = results or Results()
    rendered, broken = {}, []
    for path in documents:
        try:
            rendered[path] = render(path.read_text(encoding="utf-8"), results)
        except Broken as exc:
            broken += [f"{path}: {line}" for line in str(exc).splitlines()]
    if broken:
        raise Broken("\n".join(broken))
    changed = []
    for path, new in rendered.items():
        if new != path.read_text(encoding="utf-8"):
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def _where(path: Path, text: str, marker: Marker) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{text.count(chr(10), 0, marker.start) + 1}"


def check(documents: tuple[Path, ...], results: Results | None = None, complete: bool = False) -> list[str]:
    """Where `documents` and their results differ, one line each (empty: none): a marker whose content is not
    what its results give, one that names what does not exist, a figure without its run's caption in its
    section and, with `complete`, a figure not measured yet."""
    results = results or Results()
    problems = []
    for path in documents:
        text = path.read_text(encoding="utf-8")
        for marker in markers(text):
            where = _where(path, text, marker)
            name = "the list of benchmarks" if marker.kind == "registry" else f"<!-- {marker.kind}: {marker.spec} -->"
            try:
                want, pending = expected(marker, results)
            except Broken as exc:
                problems.append(f"{where}: {name}: {exc}")
                continue
            if marker.content != want:
                problems.append(f"{where}: {name} differs from its results: a figure edited by hand, or results "
                                "changed without `python -m benchmarks tables`")
            elif complete and pending:
                problems.append(f"{where}: {name} is not measured yet")
        for marker in markers(text):
            line_start = text.rfind("\n", 0, marker.start) + 1
            if marker.kind in ("fig", "measured") and not text[line_start:marker.start].strip():
                problems.append(f"{_where(path, text, marker)}: <!-- {marker.kind}: {marker.spec} --> starts a line: "
                                "Markdown ends the paragraph there (an HTML block); put a word before it")
        for marker in uncaptioned(text):
            file, benchmark = marker.source()
            problems.append(f"{_where(path, text, marker)}: the figure <!-- fig: {marker.spec} --> has no caption "
                            f"of its run in its section: add `<!-- measured: {file} {benchmark} --><!-- /measured -->` "
                            "near it (or its table) and run `python -m benchmarks tables`")
    return problems
