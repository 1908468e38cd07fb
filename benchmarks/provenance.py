"""Where a published figure comes from: the results files in `benchmarks/results/`, a run of a benchmark in one of
them, a table of that run, a cell of that table, and the sentence that says what machine, date and command
measured it.

A results file holds runs (`python -m benchmarks run SUITE --json benchmarks/results/SUITE.json` writes one per
benchmark of the suite); each run names its benchmark, the machine (CPU model, cores, memory; the GPU, its
driver and the libraries where there is one), the date, the harness command and the benchmark's own command.
A run copied by hand from an older document (no raw output kept) says so in `transcribed` and keeps what is
known of its machine and date; "not recorded" is said, never guessed.

`<suite>.json` is the file of a suite's run (read.json, convert.json, ...). Until the harness has written a
suite's file, or the run of a benchmark in it, a figure taken from there is *pending*: shown as not measured
yet, with the command that measures it, and `python -m benchmarks tables --check --complete` fails on it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.registry import BENCHMARKS, SUITES
from benchmarks.report import Table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RECORDED = "recorded.json"  # the runs transcribed by hand from before the harness kept its output
NOT_RECORDED = "not recorded"


class Broken(ValueError):
    """A marker that names what does not exist (a file, a benchmark, a table, a row or a column)."""


class Pending(Exception):
    """A figure whose run is not measured yet (or was left out, or failed): shown as such, never as a figure."""


def suite_of_file(name: str) -> str | None:
    """The suite whose run `name` holds (`read.json` -> "read"), or None for another results file."""
    stem = name.removesuffix(".json")
    return stem if name.endswith(".json") and stem in SUITES else None


def measure_command(name: str) -> str:
    """The command that writes the suite file `name`."""
    return f"python -m benchmarks run {suite_of_file(name)} --json benchmarks/results/{name}"


def machine_text(machine: dict[str, Any]) -> str:
    """"AMD EPYC, 2 cores, 23.5 GiB" (+ the GPU, its driver and libraries where there is one); what was not
    recorded is said so."""
    cores = f"{machine['cores']} cores" if machine.get("cores") else ""
    memory = f"{machine['memory_gib']} GiB" if machine.get("memory_gib") else ""
    missing = [name for name, value in (("CPU model", machine.get("cpu")), ("cores", cores), ("memory", memory))
               if not value]
    text = ", ".join(v for v in (machine.get("cpu") or "a machine of " + (cores or "unknown cores"),
                                 cores if machine.get("cpu") else "", memory) if v)
    text += f" ({' and '.join(missing)} not recorded)" if missing else ""
    return text + (f", {machine['gpu'].replace(' | ', ', ')}" if machine.get("gpu") else "")


@dataclass(frozen=True)
class Run:
    """One benchmark's run in a results file: its record and the file's own fields (older files kept the machine
    and date once, for all their runs)."""

    file: str
    record: dict[str, Any]
    top: dict[str, Any]

    def field(self, name: str) -> Any:
        return self.record.get(name, self.top.get(name))

    def harness(self) -> str:
        """The harness command that measured this run, without where it wrote its results (files written before
        the harness kept its command name their suite, or benchmark, once)."""
        harness = self.field("harness") or (f"python -m benchmarks run {self.top['suite']}" if self.top.get("suite")
                                            else "")
        return harness.split(" --json")[0]

    @property
    def tables(self) -> list[Table]:
        return [Table.from_json(t) for t in self.record.get("tables", [])]

    def provenance(self, short: bool = False) -> str:
        """Where this run's figures come from, as a clause: "measured on <machine>, <date>: `<command>`" or
        "transcribed by hand from ...: measured <date> on <machine>, `<command>`". `short`: the machine's CPU
        and cores, the day and the suite's command (for a caption in prose)."""
        machine = self.field("machine") or {}
        date = self.field("date") or f"date {NOT_RECORDED}"
        command = self.record.get("command") or f"command {NOT_RECORDED}"
        transcribed = self.record.get("transcribed")
        smoke = " (SMOKE RUN: its figures mean nothing)" if self.field("smoke") else ""
        if short:
            where = (f"{machine['cpu']}, {machine.get('cores', '?')} cores" if machine.get("cpu") else
                     f"a machine of {machine.get('cores', '?')} cores") + (
                f", {machine['gpu'].split(' | ')[0]}" if machine.get("gpu") else "")
            if transcribed:
                return f"transcribed by hand, no raw output kept: measured {date[:10]} on {where}{smoke}"
            return f"measured on {where}, {date[:10]}: `{self.harness() or command}`{smoke}"
        if transcribed:
            return (f"transcribed by hand from {transcribed} (no raw output kept): measured {date} on "
                    f"{machine_text(machine)}, `{command}`{smoke}")
        harness = self.harness()
        run = f"`{harness}` (`{command}`)" if harness else f"`{command}`"
        return f"measured on {machine_text(machine)}, {date}: {run}{smoke}"


class Results:
    """The results files of one folder, read once each."""

    def __init__(self, folder: Path = RESULTS) -> None:
        self.folder = Path(folder)
        self._files: dict[str, dict[str, Any] | None] = {}

    def data(self, name: str) -> dict[str, Any] | None:
        """The results file `name` (None: a suite's file the harness has not written yet)."""
        if name not in self._files:
            path = self.folder / name
            if path.exists():
                self._files[name] = json.loads(path.read_text(encoding="utf-8"))
            elif suite_of_file(name):
                self._files[name] = None
            else:
                raise Broken(f"benchmarks/results/{name} does not exist")
        return self._files[name]

    def run(self, name: str, benchmark: str) -> Run:
        """The last run of `benchmark` in `name`; Pending when it is not measured yet, was left out or failed."""
        suite = suite_of_file(name)
        known = {b.name: b.suite for b in BENCHMARKS}
        base = benchmark.split("@", 1)[0]
        if base not in known:
            raise Broken(f"{name}: no benchmark {base!r} in benchmarks/registry.py")
        if suite and known[base] != suite:
            raise Broken(f"{name} holds the {suite} suite's runs; {base} is in the {known[base]} suite")
        data = self.data(name)
        runs = [r for r in (data or {}).get("runs", []) if r["benchmark"] == benchmark]
        if not runs:
            if suite:
                earlier = [r for r in (self.data(RECORDED) or {}).get("runs", [])
                           if r["benchmark"].startswith(f"{benchmark}@")] if (self.folder / RECORDED).exists() else []
                raise Pending(f"not measured yet: `{measure_command(name)}` measures it" + (
                    "; its last figures, transcribed: benchmarks/README.md, \"Earlier runs\"" if earlier else ""))
            raise Broken(f"benchmarks/results/{name} has no run of {benchmark}")
        record = runs[-1]
        if "left_out" in record:
            raise Pending(f"not measured in the run of {record.get('date', data.get('date'))}: left out "
                          f"({record['left_out']})")
        if record.get("exit", 0) != 0:
            raise Pending(f"not measured: its run of {record.get('date', data.get('date'))} failed "
                          f"(exit {record['exit']})")
        return Run(name, record, {k: v for k, v in data.items() if k != "runs"})

    def table(self, name: str, benchmark: str, key: int | str) -> tuple[Run, Table]:
        """Table `key` of `benchmark`'s run in `name`: its index (0: the first the run made) or a part of its
        title that no other table of the run has."""
        run = self.run(name, benchmark)
        tables = run.tables
        if isinstance(key, int):
            if key >= len(tables):
                raise Broken(f"{name}: {benchmark} made {len(tables)} tables, not {key + 1}")
            return run, tables[key]
        found = [t for t in tables if key in t.title]
        if len(found) != 1:
            titles = "; ".join(repr(t.title[:70]) for t in tables)
            raise Broken(f"{name}: {len(found)} tables of {benchmark} have {key!r} in their title (one must): "
                         f"{titles}")
        return run, found[0]


def _unbold(cell: str) -> str:
    return cell.replace("**", "").strip()


def row_of(table: Table, key: int | str) -> tuple[str, ...]:
    """Row `key` of `table`: its index, or text of its first cell (that cell exactly, else the one row whose first
    cell, else whose cells, contain it)."""
    if isinstance(key, int):
        if key >= len(table.rows):
            raise Broken(f"table {table.title[:60]!r} has {len(table.rows)} rows, not {key + 1}")
        return table.rows[key]
    for candidates in ([r for r in table.rows if _unbold(r[0]) == key], [r for r in table.rows if key in r[0]],
                       [r for r in table.rows if key in " | ".join(r)]):
        if len(candidates) == 1:
            return candidates[0]
        if len(candidates) > 1:
            raise Broken(f"{len(candidates)} rows of table {table.title[:60]!r} match {key!r}: "
                         f"{[r[0] for r in candidates]}")
    raise Broken(f"no row of table {table.title[:60]!r} matches {key!r}: {[r[0] for r in table.rows]}")


def column_of(table: Table, key: int | str) -> int:
    """Column `key` of `table`: its index, or its name (exactly, else the one column whose name contains it)."""
    if isinstance(key, int):
        if key >= len(table.columns):
            raise Broken(f"table {table.title[:60]!r} has {len(table.columns)} columns, not {key + 1}")
        return key
    exact = [i for i, c in enumerate(table.columns) if c == key]
    found = exact or [i for i, c in enumerate(table.columns) if key in c]
    if len(found) != 1:
        raise Broken(f"{len(found)} columns of table {table.title[:60]!r} match {key!r}: {list(table.columns)}")
    return found[0]


def cell(table: Table, row: int | str, column: int | str) -> str:
    """The cell as the runner formatted it, without Markdown bold."""
    value = _unbold(row_of(table, row)[column_of(table, column)])
    if not value:
        raise Broken(f"the cell ({row!r}, {column!r}) of table {table.title[:60]!r} is empty")
    return value


def number(value: str) -> float:
    """The number a formatted cell shows ("2,402", "1.32x", "x1.39", "26%", "0.79 (rounds 0.74-0.80)")."""
    found = re.search(r"[-+]?\d[\d,]*(?:\.\d+)?", value)
    if not found:
        raise Broken(f"no number in the cell {value!r}")
    return float(found.group().replace(",", ""))


def ratio(numerator: str, denominator: str) -> str:
    """The ratio of two cells, as the documents write a ratio: "2.41x"."""
    return f"{number(numerator) / number(denominator):.2f}x"
