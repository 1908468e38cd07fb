"""fastdata bench as the before/after proof: baseline, fastdata and the synthetic upper bound in one run, the
summary lines, `--json` and `--plot` (functional only: no speed is asserted)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from builders.images import build_solid_tree

import fastdata
from fastdata.cli import main
from fastdata.errors import ConfigError
from fastdata.tools.bench import (
    UPPER_BOUND,
    BenchConfig,
    LoaderResult,
    MemoryBatches,
    RunResult,
    collect_batches,
    format_summary,
    format_table,
    make_step,
    run_bench,
)
from fastdata.tools.bench_report import bench_dict, coarsen, plot_runs, smooth, write_json

COUNT = 14
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_report")
    tree = build_solid_tree(root / "src", count=COUNT)
    fastdata.convert_imagefolder(tree.root, root / "tiny.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    return tree.root, root / "tiny.lmdb"


def test_baseline_fastdata_and_upper_bound_in_one_run(tiny):
    src, lmdb = tiny
    config = BenchConfig(epochs=2, batch_size=4, image_size=24, workers=0, step="to-device", repeats=1)
    results = run_bench(lmdb, config, baseline_imagefolder=src, upper_bound=True)
    assert [(r.name, r.role) for r in results] == [("torchvision ImageFolder", "baseline"),
                                                    ("fastdata (lmdb)", "loader"), (UPPER_BOUND, "upper-bound")]
    for r in results:
        run = r.runs[0]
        assert run.images == 2 * COUNT  # the same timed passes, after one untimed pass each
        assert 0 <= run.data_wait_fraction <= 1
        assert run.timeline["t"] and len(run.timeline["t"]) == len(run.timeline["samples_per_s"])
        assert run.system is not None and "cpu_percent" in run.system
    summary = format_summary(results).splitlines()
    assert summary[0].startswith("  torchvision ImageFolder: ") and summary[0].endswith(
        "% of the synthetic upper bound")
    assert "x torchvision ImageFolder, " in summary[1] and summary[1].endswith("% of the synthetic upper bound")
    assert summary[2].startswith(f"  ({UPPER_BOUND}: the same batches from memory")


def test_collect_batches_caps_memory_and_keeps_the_step_count(tiny):
    _, lmdb = tiny
    loader = fastdata.loader(lmdb, batch_size=4, image_size=16, num_workers=0)
    one_batch = 4 * 3 * 16 * 16
    kept, per_pass = collect_batches(loader, limit_bytes=one_batch + 1)
    assert len(kept) == 1 and per_pass == 4
    memory = MemoryBatches(kept, per_pass)
    assert len(memory) == 4 and all(images is kept[0][0] for images, _ in memory)
    kept, per_pass = collect_batches(loader, limit_bytes=10**9)
    assert len(kept) == per_pass == 4
    with pytest.raises(ConfigError, match="at least one batch"):
        MemoryBatches([], 3)


def test_steps():
    assert make_step("none") == (None, None) and make_step(None) == (None, None)
    work, _ = make_step("to-device")
    out = work(torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), torch.zeros(2))
    assert out.dtype == torch.float32 and float(out.max()) == 1.0
    seen = []
    work, finish = make_step(lambda images, labels: seen.append(len(labels)))
    work(None, [1, 2])
    assert seen == [2] and finish is None
    with pytest.raises(ConfigError, match="step must be one of"):
        make_step("train")
    with pytest.raises(ConfigError, match="step must be one of"):
        BenchConfig(step="gpu")


def fake_results():
    def result(name, role, images, wait):
        runs = [RunResult(name, images, 1.0, 0.1, 1000.0, data_wait_fraction=wait,
                          timeline={"bin_s": 0.5, "t": [0.25, 0.75], "samples_per_s": [images, images],
                                    "steps_per_s": [1.0, 1.0], "data_wait_fraction": [wait or 0.0, 0.0]})]
        return LoaderResult(name, runs, role)

    return [result("baseline", "baseline", 100, 0.8), result("fast", "loader", 400, 0.1),
            result(UPPER_BOUND, "upper-bound", 800, None)]


def test_summary_and_table_figures():
    results = fake_results()
    assert format_summary(results).splitlines() == [
        "  baseline: 12% of the synthetic upper bound",
        "  fast: 4.00x baseline, 50% of the synthetic upper bound",
        f"  ({UPPER_BOUND}: the same batches from memory through the same step, 800 images/s)"]
    lines = format_table(results, data_wait=True).splitlines()
    assert lines[0] == "baseline: baseline" and "data wait" in lines[1]
    assert lines[3].split()[-2:] == ["80%", "1.00x"]
    assert lines[4].split()[-2:] == ["10%", "4.00x"]
    assert lines[5].split()[-2:] == ["n/a", "8.00x"]
    assert "data wait" not in format_table(results)


def test_json_has_every_figure(tmp_path):
    results = fake_results()
    config = BenchConfig(epochs=1, workers=2)
    path = write_json(tmp_path / "out" / "bench.json", results, config, "data.lmdb", "src/")
    data = json.loads(path.read_text())
    assert data == json.loads(json.dumps(bench_dict(results, config, "data.lmdb", "src/")))
    assert data["config"]["num_workers"] == 2 and data["dataset"] == "data.lmdb"
    assert data["machine"]["cores"] >= 1
    fast = data["loaders"][1]
    assert fast["vs_baseline"] == 4.0 and fast["of_upper_bound"] == 0.5
    assert fast["runs"][0]["images_per_s"] == 400 and fast["runs"][0]["timeline"]["t"] == [0.25, 0.75]


def test_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")  # in the dev extra; the next test covers its absence
    path = plot_runs(tmp_path / "plots" / "bench.png", fake_results(), title="test")
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000


def test_plot_without_matplotlib_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r"pip install 'fastdata\[plot\]'"):
        plot_runs(tmp_path / "x.png", fake_results())


def test_coarsen_averages_neighbours():
    timeline = {"bin_s": 0.1, "t": [0.05, 0.15, 0.25, 0.35, 0.45], "samples_per_s": [1, 3, 5, 7, 9],
                "steps_per_s": [1, 1, 1, 1, 1], "data_wait_fraction": [0, 1, 0, 1, 0.5]}
    out = coarsen(timeline, 3)
    assert out["samples_per_s"] == [2, 6, 9] and out["data_wait_fraction"] == [0.5, 0.5, 0.5]
    assert out["bin_s"] == pytest.approx(0.2)
    assert coarsen(timeline, 10) is timeline


def test_smooth_averages_over_about_four_steps():
    n = 20  # one batch of 8 every other 0.1 s bin: 5 steps/s, jagged
    timeline = {"bin_s": 0.1, "t": [0.05 + 0.1 * i for i in range(n)],
                "samples_per_s": [80.0 if i % 2 == 0 else 0.0 for i in range(n)],
                "steps_per_s": [10.0 if i % 2 == 0 else 0.0 for i in range(n)],
                "data_wait_fraction": [0.0 if i % 2 == 0 else 1.0 for i in range(n)]}
    out = smooth(timeline, points=60)
    assert len(out["t"]) == n
    middle = out["samples_per_s"][5:-5]
    assert max(middle) - min(middle) < 20 and 30 < sum(middle) / len(middle) < 50
    assert all(0.2 < f < 0.8 for f in out["data_wait_fraction"][5:-5])
    busy = {**timeline, "steps_per_s": [100.0] * n}  # ten steps per bin: left as it is
    assert smooth(busy, points=60)["samples_per_s"] == timeline["samples_per_s"]


def test_bench_cli_plot_and_json(tmp_path, capsys, tiny):
    pytest.importorskip("matplotlib")
    src, lmdb = tiny
    plot, data = tmp_path / "bench.png", tmp_path / "bench.json"
    code = main(["bench", str(lmdb), "--baseline-imagefolder", str(src), "--epochs", "2", "--batch-size", "4",
                 "--workers", "0", "--image-size", "24", "--repeats", "1", "--plot", str(plot), "--json", str(data)])
    out = capsys.readouterr()
    assert code == 0, out.err
    header = next(line for line in out.out.splitlines() if line.startswith("loader "))
    assert "data wait" in header
    assert any(line.startswith("note: epochs of ") and "start at each epoch" in line for line in out.out.splitlines())
    assert any(line.startswith(UPPER_BOUND) for line in out.out.splitlines())
    assert "% of the synthetic upper bound" in out.out
    assert plot.read_bytes().startswith(PNG)
    figures = json.loads(data.read_text())
    assert [x["role"] for x in figures["loaders"]] == ["baseline", "loader", "upper-bound"]
    assert figures["config"]["step"] == "to-device"
    assert figures["config"]["warmup_passes"] == 1 and figures["config"]["page_cache"] == "warm"
    assert figures["config"]["settings"]["num_workers"] == 0
    assert "the bytes the dataset stores" in figures["loaders"][0]["inputs"]


def test_bench_cli_without_upper_bound_or_step(capsys, tiny):
    _, lmdb = tiny
    code = main(["bench", str(lmdb), "--epochs", "1", "--batch-size", "4", "--workers", "0", "--image-size", "16",
                 "--repeats", "1", "--no-upper-bound", "--step", "none"])
    out = capsys.readouterr().out
    assert code == 0
    assert UPPER_BOUND not in out and "data wait" not in out
