"""A benchmark's results as tables: what every runner in benchmarks/ prints, and what the harness
(`python -m benchmarks run`) keeps as JSON.

A runner calls `table(...)` for each table it has measured: the table is printed as Markdown (the runner's output
reads as before), and when the harness runs the runner it is also appended, as one JSON line, to the file named by
the environment variable `FASTDATA_BENCH_SINK`; the harness gathers those lines into the run's JSON results, and
`python -m benchmarks tables` writes the READMEs' tables from them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SINK = "FASTDATA_BENCH_SINK"
OUTPUT = "output"  # the one column of a program's output kept by `output()`


@dataclass(frozen=True)
class Table:
    """One measured table: a title (what was measured, and how), the column names, the rows (cells as they are
    shown: the runner formats its numbers), how each column is aligned ("l" or "r", one letter per column) and
    notes printed under the table (per-run ratios, spreads, omitted contenders and why)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.title!r}: a row of {len(row)} cells for {len(self.columns)} columns: "
                                 f"{row}")
        if self.align and len(self.align) != len(self.columns):
            raise ValueError(f"table {self.title!r}: align {self.align!r} for {len(self.columns)} columns")

    def markdown(self) -> str:
        """The table as Markdown lines (header, alignment row, rows), without its title and notes."""
        align = self.align or "l" + "r" * (len(self.columns) - 1)
        lines = ["| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Table:
        return cls(data["title"], tuple(data["columns"]), tuple(tuple(row) for row in data["rows"]),
                   data.get("align", ""), tuple(data.get("notes", ())))


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "",
          notes: Sequence[str] = ()) -> Table:
    """Print a measured table (title, Markdown, notes) and hand it to the harness when one runs this runner.
    Cells are shown with `str()`: format numbers before passing them."""
    made = Table(title, tuple(columns), tuple(tuple(str(cell) for cell in row) for row in rows), align,
                 tuple(notes))
    print(f"\n{title}\n" if title else "")
    print(made.markdown())
    for note in made.notes:
        print(f"  {note}")
    _hand_over(made)
    return made


def output(title: str, text: str) -> Table:
    """Keep what a program printed, line by line (a table of one column, `OUTPUT`): the documents show it as a
    code block written from the results (`<!-- output: ... -->`), so that a sample of a command's output is one
    the harness recorded. Prints nothing: the runner shows the output itself."""
    made = Table(title, (OUTPUT,), tuple((line.rstrip(),) for line in text.strip("\n").splitlines()), "l")
    _hand_over(made)
    return made


def _hand_over(made: Table) -> None:
    """Append `made` to the harness's sink, when a harness runs this runner."""
    sink = os.environ.get(SINK)
    if sink:
        with open(sink, "a", encoding="utf-8") as file:
            file.write(json.dumps(made.to_json()) + "\n")


def read_sink(path: str) -> list[Table]:
    """The tables a runner handed over through `path` (empty when it made none)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as file:
        return [Table.from_json(json.loads(line)) for line in file if line.strip()]
