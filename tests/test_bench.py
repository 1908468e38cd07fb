"""bench (functional only, no timing assertions): both loaders run over a tiny dataset and the table has a
row per loader with a ratio against the baseline."""

from __future__ import annotations

import re

import pytest
from conftest import build_solid_tree

import fastdata
from fastdata.bench import BenchConfig, LoaderResult, RunResult, format_table, run_bench
from fastdata.cli import main

COUNT = 14
RATIO = re.compile(r"\d+\.\d\dx\s*$")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    tree = build_solid_tree(root / "src", count=COUNT)
    fastdata.convert_imagefolder(tree.root, root / "tiny.lmdb", workers=1, progress=False)
    fastdata.convert_imagefolder(tree.root, root / "tiny_wds", format="wds", shard_size="8KB", workers=1,
                                 progress=False)
    return tree.root, root / "tiny.lmdb", root / "tiny_wds"


@pytest.mark.parametrize("augment", ["train", "val"])
def test_run_bench_with_baseline(tiny, augment):
    src, lmdb_out, _ = tiny
    config = BenchConfig(epochs=1, batch_size=4, image_size=24, augment=augment, workers=0)
    progress: list[str] = []
    results = run_bench(lmdb_out, config, baseline_imagefolder=src, progress=progress.append)
    assert [r.name for r in results] == ["torchvision ImageFolder", "fastdata (lmdb)"]
    for result in results:
        assert len(result.runs) == 1
        run = result.runs[0]
        assert run.images == COUNT - 4  # everything after the first (warm-up) batch
        assert run.seconds > 0 and run.first_batch_s > 0
        assert run.bytes_per_image > 0
        assert result.images_per_s > 0 and result.mb_per_s > 0
    assert len(progress) == 2 and all("bench:" in line for line in progress)
    table = format_table(results)
    lines = table.splitlines()
    assert "images/s" in lines[0]
    rows = [line for line in lines if line.startswith(("torchvision", "fastdata"))]
    assert len(rows) == 2
    assert all(RATIO.search(row) for row in rows), table
    assert rows[0].rstrip().endswith("1.00x")


def test_run_bench_wds_without_baseline_and_repeats(tiny):
    _, _, wds_out = tiny
    config = BenchConfig(epochs=2, batch_size=4, image_size=16, augment="val", workers=0, repeats=2)
    results = run_bench(wds_out, config)
    assert [r.name for r in results] == ["fastdata (wds)"]
    assert len(results[0].runs) == 2
    assert all(run.images == 2 * COUNT - 4 for run in results[0].runs)
    table = format_table(results)
    assert "fastdata (wds)" in table and table.rstrip().endswith("1.00x")


def test_format_table_ratio():
    base = LoaderResult("baseline", [RunResult("baseline", 100, 1.0, 0.1, 1000.0)])
    fast = LoaderResult("fast", [RunResult("fast", n, 1.0, 0.1, 500.0) for n in (300, 500, 400)])
    assert fast.images_per_s == 400  # median of the runs
    lines = format_table([base, fast]).splitlines()
    assert lines[-2].rstrip().endswith("1.00x")
    assert lines[-1].rstrip().endswith("4.00x")


def test_bench_cli(capsys, tiny):
    src, lmdb_out, _ = tiny
    code = main(["bench", str(lmdb_out), "--baseline-imagefolder", str(src), "--epochs", "1",
                 "--batch-size", "4", "--workers", "0", "--image-size", "24"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith(("torchvision", "fastdata"))]
    assert [row.split("  ")[0] for row in rows] == ["torchvision ImageFolder", "fastdata (lmdb)"]
    assert all(RATIO.search(row) for row in rows), captured.out
    assert "bench:" in captured.err  # progress goes to stderr, the table to stdout
    assert "Traceback" not in captured.err
