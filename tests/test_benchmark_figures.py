"""Every measured figure of README.md, docs/ and benchmarks/README.md comes from a results file and says where:
no measured-looking figure outside a marker (benchmarks/guard.py), every figure with its run's caption (machine,
date, command), transcribed runs said to be so, a figure not measured yet shown as such, and the harness keeping
each run's machine, date and command without ever mixing smoke figures into the committed results."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from builders.text import make_corpus, reference_ids, train_bytelevel, write_jsonl

from benchmarks import guard, provenance, registry, tables
from benchmarks.report import Table

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

MACHINE = {"cpu": "Test CPU 9000", "cores": 2, "memory_gib": 7.5}


def harness():
    return importlib.import_module("benchmarks.__main__")


def visible(text: str) -> str:
    """What a reader sees: the text without its HTML comments (the markers)."""
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def write_results(folder: Path, name: str, runs: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"smoke": False, "runs": runs}), encoding="utf-8")


def a_run(benchmark: str = "meter_overhead", **fields) -> dict:
    table = Table("overhead of the meter", ("loop", "us/step", "x plain"),
                  (("empty step", "1.25", "**1.50x**"), ("10 ms step", "500.0", "1.05x")), "lrr", ("a note",))
    return {"benchmark": benchmark, "suite": "read", "date": "2031-02-03 04:05 UTC", "machine": MACHINE,
            "harness": "python -m benchmarks run read --json benchmarks/results/read.json",
            "command": "python -m benchmarks.meter_overhead", "exit": 0, "tables": [table.to_json()], **fields}


# ---------------------------------------------------------------------------------------------- the guard


def test_no_measured_figure_outside_a_marker():
    stray = [f"{path.relative_to(ROOT)}:{line}: {context!r}" for path in tables.DOCUMENTS
             for line, context in guard.unguarded(path)]
    assert not stray, "measured figures outside a marker:\n" + "\n".join(stray) + "\n\n" + guard.HOW_TO_ADD


def test_every_allowance_is_still_needed():
    assert guard.unused_allowances(tables.DOCUMENTS) == []


def test_the_guard_catches_a_figure_written_by_hand(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(
        "fastdata runs at 9.22x the baseline, 2,480 img/s on 4.3 host cores (0.65 ms, +2.2%, x1.39, 1.3 MB/s).\n"
        "Not figures: a 500x375 photo, a 30,000 x 30,000 PNG, Python 3.10, 10 x 40 tries, `--step 120ms`,\n"
        "targets: parent <= 12%, >= 2.5x, < 50 us,\n"
        "<!-- fig: read.json cpu_path 0 0 1 -->2,402 images/s<!-- /fig -->, the default 4MB.\n"
        "A sample of its output:\n\n<!-- sample -->\n```\nthroughput 760.8 samples/s\n```\n\n"
        "Unmarked output:\n\n```\ndata wait 97%\n```\n\n```python\nloader = f(size=256MB)\n```\n",
        encoding="utf-8")
    monkeypatch.setitem(guard.ALLOWED, "page.md", {"the default 4MB": "a default"})
    found = [context for _, context in guard.unguarded(page)]
    hits = " / ".join(found)
    for figure in ("9.22x", "2,480 img/s", "4.3 host cores", "0.65 ms", "+2.2%", "x1.39", "1.3 MB/s", "97%"):
        assert figure.lstrip("+") in hits, figure
    for not_a_figure in ("500x375", "30,000 x", "3.10", "10 x 40", "120ms", "2,402", "760.8", "256MB", "4MB",
                         "12%", "2.5x", "50 us"):
        assert not_a_figure not in hits, not_a_figure
    assert next(line for line, _ in guard.unguarded(page)) == 1


def test_a_sample_block_must_say_it_is_a_sample(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("The report:\n\n<!-- sample -->\n```\ndata wait 97%\n```\n", encoding="utf-8")
    assert [line for line, _ in guard.unguarded(page)] == [5]


def test_the_message_says_how_to_add_a_figure():
    for step in ("report.table", "python -m benchmarks run SUITE --json", "<!-- fig:", "<!-- measured:",
                 "python -m benchmarks tables", "ALLOWED"):
        assert step in guard.HOW_TO_ADD


# ---------------------------------------------------------------------------------------------- captions


def test_a_table_and_a_figure_show_their_machine_date_and_command(tmp_path):
    write_results(tmp_path, "read.json", [a_run()])
    page = tmp_path / "page.md"
    page.write_text('## A\n\n<!-- results: read.json meter_overhead 0 -->\n<!-- /results -->\n\n'
                    'It costs <!-- fig: read.json meter_overhead "overhead" "empty" us/step --><!-- /fig --> us, '
                    '<!-- fig: read.json meter_overhead 0 "empty" "x plain" --><!-- /fig --> the plain loop, '
                    '<!-- fig: read.json meter_overhead 0 "10 ms" us/step / "empty" us/step --><!-- /fig --> '
                    '(<!-- measured: read.json meter_overhead --><!-- /measured -->).\n', encoding="utf-8")
    results = provenance.Results(tmp_path)
    tables.update((page,), results)
    text = visible(page.read_text(encoding="utf-8"))
    assert "It costs 1.25 us, 1.50x the plain loop, 400.00x (measured on Test CPU 9000, 2 cores, 2031-02-03: " \
           "`python -m benchmarks run read`)" in text
    assert "- a note\n\n*Measured on Test CPU 9000, 2 cores, 7.5 GiB, 2031-02-03 04:05 UTC: `python -m benchmarks " \
           "run read` (`python -m benchmarks.meter_overhead`).*" in text
    assert tables.check((page,), results) == []


def test_a_figure_without_its_runs_caption_in_its_section_fails(tmp_path):
    write_results(tmp_path, "read.json", [a_run()])
    page = tmp_path / "page.md"
    page.write_text('## A\n\nSee (<!-- measured: read.json meter_overhead --><!-- /measured -->).\n\n## B\n\n'
                    'It costs <!-- fig: read.json meter_overhead 0 "empty" us/step --><!-- /fig --> us.\n',
                    encoding="utf-8")
    results = provenance.Results(tmp_path)
    tables.update((page,), results)
    (problem,) = tables.check((page,), results)
    assert "has no caption of its run in its section" in problem and "<!-- measured: read.json meter_overhead" \
        in problem


def test_a_transcribed_run_says_so_with_its_date_and_what_is_not_known(tmp_path):
    write_results(tmp_path, "recorded.json", [
        {"benchmark": "gpu_check@2026-12-04", "transcribed": "benchmarks/README.md at b47788f",
         "date": "2026-12-04", "machine": {"cpu": None, "cores": 16, "gpu": "NVIDIA H200 | driver 1.2"},
         "command": "python benchmarks/gpu_check.py", "tables": [a_run()["tables"][0]]}])
    run = provenance.Results(tmp_path).run("recorded.json", "gpu_check@2026-12-04")
    caption = run.provenance()
    assert caption.startswith("transcribed by hand from benchmarks/README.md at b47788f (no raw output kept): "
                              "measured 2026-12-04 on a machine of 16 cores (CPU model and memory not recorded), "
                              "NVIDIA H200, driver 1.2")
    assert "transcribed by hand" in run.provenance(short=True) and "NVIDIA H200" in run.provenance(short=True)


def test_a_figure_starting_a_line_is_refused(tmp_path):
    """Markdown ends a paragraph at a line that starts with an HTML comment: the sentence would break there."""
    write_results(tmp_path, "read.json", [a_run()])
    page = tmp_path / "page.md"
    page.write_text('## A\n\nIt costs\n<!-- fig: read.json meter_overhead 0 "empty" us/step --><!-- /fig --> us '
                    '(<!-- measured: read.json meter_overhead --><!-- /measured -->).\n', encoding="utf-8")
    results = provenance.Results(tmp_path)
    tables.update((page,), results)
    (problem,) = tables.check((page,), results)
    assert "starts a line" in problem


def test_cells_are_found_by_text_and_ambiguity_is_refused():
    table = Table("t", ("loader", "images/s", "images/s per core"),
                  (("fastdata (region decode)", "2,402", "1,201"), ("fastdata, restart", "2,913", "1,456"),
                   ("**fastdata**", "**3,000**", "1,500")))
    assert provenance.cell(table, "restart", "images/s") == "2,913"
    assert provenance.cell(table, "fastdata", "images/s") == "3,000"  # the first cell exactly, bold left out
    assert provenance.cell(table, 0, 2) == "1,201"
    with pytest.raises(provenance.Broken, match="2 rows"):
        provenance.row_of(Table("t", ("a",), (("x one",), ("x two",))), "x")
    with pytest.raises(provenance.Broken, match="0 columns"):
        provenance.column_of(table, "ms")
    assert provenance.ratio("2,913", "2,402") == "1.21x"


def test_a_programs_output_is_a_code_block_with_its_caption(tmp_path):
    run = a_run("bench_sample")
    run["tables"] = [Table("$ fastdata bench", ("output",), (("loader   images/s",), ("fastdata    1,175",)),
                           "l").to_json()]
    write_results(tmp_path, "read.json", [run])
    page = tmp_path / "page.md"
    page.write_text("<!-- output: read.json bench_sample 0 -->\n<!-- /output -->\n", encoding="utf-8")
    tables.update((page,), provenance.Results(tmp_path))
    assert page.read_text(encoding="utf-8").startswith(
        "<!-- output: read.json bench_sample 0 -->\n```\nloader   images/s\nfastdata    1,175\n```\n\n*Measured on "
        "Test CPU 9000")


# ---------------------------------------------------------------------------------------------- pending


def test_a_figure_not_measured_yet_says_so_and_fails_only_a_complete_check(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("## A\n\n<!-- results: text.json text_convert 0 -->\n<!-- /results -->\n\nfastdata at "
                    "<!-- fig: text.json text_convert 0 0 1 --><!-- /fig --> tokens/s.\n", encoding="utf-8")
    results = provenance.Results(tmp_path)  # no text.json: the text suite has not run
    tables.update((page,), results)
    text = visible(page.read_text(encoding="utf-8"))
    assert "*Not measured yet: `python -m benchmarks run text --json benchmarks/results/text.json` measures " \
           "it.*" in text and f"fastdata at {tables.NOT_MEASURED} tokens/s" in text
    assert tables.check((page,), results) == []
    assert len(tables.check((page,), results, complete=True)) == 2
    write_results(tmp_path, "text.json", [a_run("text_convert", left_out="`datasets` is not installed")])
    tables.update((page,), provenance.Results(tmp_path))
    assert "left out (`datasets` is not installed)" in page.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------- results files


def test_every_results_file_names_machine_date_and_command_of_each_run():
    for path in sorted((BENCHMARKS / "results").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert not data.get("smoke"), f"{path.name}: smoke figures are never committed"
        top = {k: v for k, v in data.items() if k != "runs"}  # files older than per-run fields keep them once
        for record in data["runs"]:
            name = f"{path.name}: {record['benchmark']}"
            run = provenance.Run(path.name, record, top)
            assert run.field("date") and record.get("command"), name
            machine = run.field("machine")
            assert machine.get("cores"), name
            if record.get("transcribed"):
                assert path.name == provenance.RECORDED, name
            else:
                assert machine.get("cpu") and machine.get("memory_gib") and run.harness(), name
                suite = provenance.suite_of_file(path.name)
                assert suite in (None, record["suite"]), f"{name}: the {record['suite']} suite's run in {path.name}"
            if record.get("suite") == "device" or "gpu" in record["benchmark"]:
                assert "driver" in machine.get("gpu", ""), f"{name}: a GPU run names its GPU and driver"


def test_the_harness_keeps_each_runs_machine_date_and_command_and_replaces_only_what_it_ran(tmp_path,
                                                                                            monkeypatch):
    main = harness()
    out = tmp_path / "read.json"
    out.write_text(json.dumps({"smoke": False, "date": "2030-01-01", "machine": MACHINE,
                               "runs": [a_run("epoch_start"), a_run("tiny", command="old")]}), encoding="utf-8")
    code = "from benchmarks import report; report.table('t', ['a', 'b'], [['x', '1']])"
    tiny = registry.Benchmark("tiny", "read", "a tiny one", command=("-c", code))
    monkeypatch.setattr(main, "select", lambda name: [tiny])
    argv = ["run", "tiny", "--json", str(out)]
    args = argparse.Namespace(suite="tiny", smoke=False, repeats=None, json=str(out), argv=argv)
    assert main.run(args) == 0
    runs = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert [r["benchmark"] for r in runs] == ["epoch_start", "tiny"]
    kept, ran = runs
    assert kept["date"] == "2031-02-03 04:05 UTC" and kept["machine"] == MACHINE  # untouched
    assert ran["command"] != "old" and ran["harness"] == f"python -m benchmarks run tiny --json {out}"
    assert ran["machine"]["cores"] and ran["machine"]["cpu"] is not None and ran["date"][:2] == "20"
    assert [Table.from_json(t).rows for t in ran["tables"]] == [(("x", "1"),)]


def test_a_smoke_run_never_writes_into_the_committed_results(tmp_path):
    main = harness()
    tiny = [registry.Benchmark("tiny", "read", "")]
    with pytest.raises(SystemExit, match="--smoke figures mean nothing"):
        main.earlier_runs(BENCHMARKS / "results" / "read.json", True, tiny)
    real = tmp_path / "read.json"
    real.write_text(json.dumps({"smoke": False, "runs": []}), encoding="utf-8")
    with pytest.raises(SystemExit, match="holds real runs"):
        main.earlier_runs(real, True, tiny)


def test_tables_can_render_copies_from_another_results_folder(tmp_path):
    """What the lead runs before committing a fresh run: the documents rendered from scratch results into copies;
    the committed documents untouched."""
    before = {path: path.read_text(encoding="utf-8") for path in tables.DOCUMENTS}
    main = harness()
    args = argparse.Namespace(check=False, complete=False, results=str(BENCHMARKS / "results"),
                              render_to=str(tmp_path / "docs"), argv=[])
    assert main.tables(args) == 0
    assert all(path.read_text(encoding="utf-8") == text for path, text in before.items())
    assert (tmp_path / "docs" / "README.md").read_text(encoding="utf-8") == before[ROOT / "README.md"]


# ---------------------------------------------------------------------------------------------- baselines


def test_the_text_conversion_peers_write_the_ids_fastdata_writes(tmp_path):
    """text_convert.py's script (encode_batch_fast on chunks + np.concatenate) and HF datasets pipeline (batched
    map + numpy packing) do the same work as fastdata's conversion: each document's ids and an end-of-text."""
    from benchmarks import text_convert

    docs = make_corpus(60)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    tokenizer = train_bytelevel(tmp_path / "bpe.json", docs)
    from tokenizers import Tokenizer

    eos = Tokenizer.from_file(str(tokenizer)).token_to_id("<|endoftext|>")
    expected = np.array([t for doc in docs for t in [*reference_ids(tokenizer, doc), eos]], dtype=np.uint16)
    done = subprocess.run([sys.executable, "-c", text_convert.SCRIPT, str(corpus), str(tokenizer),
                           str(tmp_path / "ids.bin")], capture_output=True, text=True, check=True)
    assert int(done.stdout.split()[-1]) == len(expected)
    assert np.array_equal(np.fromfile(tmp_path / "ids.bin", dtype=np.uint16), expected)
    pytest.importorskip("datasets")
    done = subprocess.run([sys.executable, "-c", text_convert.DATASETS, str(corpus), str(tokenizer),
                           str(tmp_path / "hf"), "2"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) == len(expected)
    packed = np.fromfile(tmp_path / "hf.bin", dtype=np.uint16).reshape(-1, 1024)
    assert np.array_equal(packed.reshape(-1), expected[: packed.size])
