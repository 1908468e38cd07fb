"""The benchmark harness (benchmarks/): the documents' tables and figures are the results it recorded (a table or
figure edited by hand, or results changed without rewriting them, fails here), every runner is registered, a run
hands a runner's tables over as JSON and keeps the machine, date and command of each benchmark's run.
tests/test_benchmark_figures.py: no measured figure outside a marker, captions, pending figures."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import provenance, registry, tables
from benchmarks.report import Table

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

# modules of benchmarks/ that are not benchmarks: the harness and what the runners share
NOT_RUNNERS = {"__init__", "__main__", "registry", "report", "tables", "common", "device_setup", "peers",
               "text_corpus", "text_loaders", "provenance", "guard"}
READMES = (ROOT / "README.md", BENCHMARKS / "README.md")
# the tables of the READMEs that are prose, not results (their header rows)
PROSE_TABLES = {"| converted with | a batch |"}


def test_the_documents_figures_are_the_recorded_results():
    assert tables.check(tables.DOCUMENTS) == []


def test_the_documents_are_readme_docs_and_benchmarks():
    names = {str(p.relative_to(ROOT)) for p in tables.DOCUMENTS}
    assert {"README.md", "benchmarks/README.md", "docs/gpu.md", "docs/images.md", "docs/remote.md",
            "docs/guarantees.md", "docs/benchmarks.md"} <= names


def test_every_readme_table_of_results_is_generated():
    """No hand-copied results table outside a results block (the README's table of batch formats is prose)."""
    for path in READMES:
        text = path.read_text(encoding="utf-8")
        assert tables.blocks(text), f"{path} has no results blocks"
        outside = tables.MARKER.sub("", text)
        lines = outside.splitlines()
        headers = [line for i, line in enumerate(lines) if line.startswith("|") and not lines[i - 1].startswith("|")]
        stray = [header for header in headers if header not in PROSE_TABLES]
        assert not stray, f"{path.name}: tables outside a results block: {stray}"


def test_a_table_changed_by_hand_is_caught(tmp_path):
    readme = tmp_path / "README.md"
    text = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    marker = next(m for m in tables.markers(text) if m.kind == "results" and "Not measured" not in m.content)
    row = marker.content.strip("\n").splitlines()[2]
    changed = row.replace(row.split("|")[2], " 1 ", 1)
    readme.write_text(text.replace(row, changed, 1), encoding="utf-8")
    drift = tables.check((readme,))
    assert len(drift) == 1 and marker.spec in drift[0] and "edited by hand" in drift[0]
    tables.update((readme,))
    assert tables.check((readme,)) == []
    assert readme.read_text(encoding="utf-8") == text


def test_a_figure_in_prose_changed_by_hand_is_caught(tmp_path):
    """The audit's case: README's ratio changed from 1.22x to 9.22x passed every check; a figure in prose is a
    marker now, and a hand edit of it fails."""
    for source in tables.DOCUMENTS:
        text = source.read_text(encoding="utf-8")
        figures = [m for m in tables.markers(text) if m.kind == "fig" and m.content != tables.NOT_MEASURED]
        if not figures:
            continue
        copy = tmp_path / source.name
        figure = figures[0]
        edited = ("8" if figure.content[0] == "9" else "9") + figure.content[1:]
        copy.write_text(text[:figure.span[0]] + edited + text[figure.span[1]:], encoding="utf-8")
        drift = tables.check((copy,))
        assert len(drift) == 1 and figure.spec in drift[0], (source, drift)
        tables.update((copy,))
        assert copy.read_text(encoding="utf-8") == text


def test_changed_results_without_rewritten_tables_are_caught(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(tables.HERE / "results", results)
    recorded = json.loads((results / "recorded.json").read_text(encoding="utf-8"))
    recorded["runs"][0]["tables"][0]["rows"][0][1] = "999,999"
    (results / "recorded.json").write_text(json.dumps(recorded), encoding="utf-8")
    first = recorded["runs"][0]["benchmark"]
    drift = tables.check(tables.DOCUMENTS, provenance.Results(results))
    assert drift and all(first in line for line in drift)


def test_a_marker_naming_what_does_not_exist_is_refused(tmp_path):
    page = tmp_path / "page.md"
    for spec, why in (("nothing.json cpu_path 0", "does not exist"), ("read.json no_such_benchmark 0", "registry"),
                      ("read.json gpu_check 0", "device suite"), ("recorded.json cpu_path@1999-01-01 0", "no run")):
        page.write_text(f"<!-- results: {spec} -->\n<!-- /results -->\n", encoding="utf-8")
        (problem,) = tables.check((page,))
        assert why in problem
        with pytest.raises(provenance.Broken, match=why):
            tables.update((page,))


def test_every_runner_is_registered_in_a_known_suite():
    runners = {p.stem for p in BENCHMARKS.glob("*.py")} - NOT_RUNNERS
    modules = {b.runner.removeprefix("benchmarks.") for b in registry.BENCHMARKS if not b.command}
    assert runners == modules
    assert {b.suite for b in registry.BENCHMARKS} == set(registry.SUITES)
    names = [b.name for b in registry.BENCHMARKS]
    assert len(names) == len(set(names))
    for b in registry.BENCHMARKS:
        assert b.command or (BENCHMARKS / f"{b.runner.removeprefix('benchmarks.')}.py").exists()


def test_select_takes_a_suite_or_a_name_and_refuses_others():
    assert {b.name for b in registry.select("device")} == {"cuda_tests", "gpu_check", "gpu_train_feed"}
    assert [b.name for b in registry.select("convert_speed")] == ["convert_speed"]
    with pytest.raises(SystemExit, match="no suite or benchmark 'nope'"):
        registry.select("nope")


def test_a_table_whose_rows_do_not_fit_its_columns_is_refused():
    with pytest.raises(ValueError, match="a row of 1 cells for 2 columns"):
        Table("t", ("a", "b"), (("1",),))
    table = Table("t", ("a", "b"), (("x", "1"),), "lr", ("a note",))
    assert Table.from_json(json.loads(json.dumps(table.to_json()))) == table
    assert table.markdown() == "| a | b |\n|---|---:|\n| x | 1 |"


def test_a_run_hands_the_runners_tables_over_as_json(tmp_path, capfd):
    """A benchmark runs in a fresh process; the tables it reports arrive in its record, its output passes
    through, and a benchmark that cannot run here is left out with the reason."""
    import benchmarks.__main__ as harness
    code = ("from benchmarks import report; report.table('two rows', ['loader', 'images/s'], "
            "[['a', '1,000'], ['b', '2,000']], notes=['per-run ratios: 2.00'])")
    env = dict(__import__("os").environ)
    ran = harness.run_one(registry.Benchmark("tiny", "read", "two rows", command=("-c", code)), False, None, env)
    assert ran["exit"] == 0
    assert [Table.from_json(t).rows for t in ran["tables"]] == [(("a", "1,000"), ("b", "2,000"))]
    assert "| a | 1,000 |" in capfd.readouterr().out
    absent = harness.run_one(registry.Benchmark("gone", "read", "", needs=("no_such_module_here",)), False, None,
                             env)
    assert "no_such_module_here" in absent["left_out"] and absent["tables"] == []


def test_a_real_runner_hands_its_tables_to_the_harness(tmp_path):
    """`python -m benchmarks.convert_speed` at a tiny size, its data in a temporary folder: both of its tables
    reach the harness's sink, with a row per contender and figures that parse."""
    import os
    import subprocess

    from benchmarks.report import SINK, read_sink

    sink = tmp_path / "tables.jsonl"
    done = subprocess.run([sys.executable, "-m", "benchmarks.convert_speed", "--images", "16", "--small", "8",
                           "--repeats", "1", "--skip-text", "--skip-peers", "--data", str(tmp_path / "data")],
                          env={**os.environ, SINK: str(sink)}, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    speed, cpu = read_sink(str(sink))
    assert speed.columns == ("contender", "images/s", "x (a)")
    names = [row[0] for row in speed.rows]
    assert any("LMDB" in name for name in names) and any("WebDataset" in name for name in names)
    assert all(float(row[2]) > 0 for row in speed.rows)
    assert [row[0] for row in cpu.rows] == [name[4:] for name in names if "fastdata convert" in name]


def test_the_device_suite_fits_one_device_call_with_room_to_rerun():
    """Its benchmarks' caps and the set-up's (installing the wheels, building the extension) add up to at most
    DEVICE_SUITE_S, 540 s: one device call may run 600 s (they added up to 635 s before the set-up)."""
    from benchmarks import device_setup

    caps = sum(b.timeout for b in registry.select("device"))
    assert caps + device_setup.SETUP_TIMEOUT <= registry.DEVICE_SUITE_S <= 540


def test_a_gpu_benchmark_without_a_gpu_runs_its_cpu_smoke_and_writes_its_results_beside_the_harnesss(tmp_path,
                                                                                                    monkeypatch):
    import benchmarks.__main__ as harness
    monkeypatch.setattr(harness, "has_cuda", lambda: False)
    feed = next(b for b in registry.select("device") if b.name == "gpu_train_feed")
    assert harness.missing(feed, smoke=False) == "no CUDA GPU on this machine"
    assert harness.missing(feed, smoke=True) is None
    command = harness.command_of(feed, True, None, tmp_path / "device.gpu_train_feed.json")
    assert "--device" in command and command[command.index("--device") + 1] == "cpu"
    assert command[-2:] == ["--json", str(tmp_path / "device.gpu_train_feed.json")]
    tests = next(b for b in registry.select("device") if b.name == "cuda_tests")
    assert harness.missing(tests, smoke=True) == "no CUDA GPU on this machine"
