"""`fastdata bench --trace DIR`: one Perfetto trace per loader and run, each a valid trace file; fastdata's has its
workers' batch spans, the baseline and the synthetic upper bound at least their step spans."""

from __future__ import annotations

import pytest
from builders.images import build_solid_tree
from builders.trace import check_trace

import fastdata
from fastdata.cli import main
from fastdata.errors import ConfigError
from fastdata.tools.bench import run_contenders, trace_name
from fastdata.tools.bench_fair import BenchConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_trace")
    tree = build_solid_tree(root / "src", count=10)
    fastdata.convert_imagefolder(tree.root, root / "tiny.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    return tree.root, root / "tiny.lmdb"


def test_trace_names():
    assert trace_name("fastdata (lmdb)", 0) == "fastdata-lmdb.run1.json"
    assert trace_name("torchvision ImageFolder", 2) == "torchvision-imagefolder.run3.json"
    assert trace_name("???", 0) == "loader.run1.json"


def test_bench_trace_writes_one_trace_per_loader_and_run(tiny, tmp_path, capsys):
    src, lmdb_out = tiny
    traces = tmp_path / "traces"
    code = main(["bench", str(lmdb_out), "--baseline-imagefolder", str(src), "--epochs", "1", "--repeats", "2",
                 "--batch-size", "4", "--workers", "2", "--image-size", "16", "--step", "none",
                 "--trace", str(traces)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"traces: {traces}" in captured.err
    names = ("torchvision-imagefolder", "fastdata-lmdb", "synthetic-upper-bound")
    assert sorted(p.name for p in traces.iterdir()) == sorted(f"{n}.run{r}.json" for n in names for r in (1, 2))
    for name in names:
        trace = check_trace(traces / f"{name}.run1.json")
        steps = [e for e in trace["traceEvents"] if e["name"] == "data wait"]
        assert len(steps) == 3  # one timed pass of ceil(10 / 4) batches
        workers = {e["tid"] for e in trace["traceEvents"] if e["name"] == "batch"}
        assert workers == ({1, 2} if name == "fastdata-lmdb" else set())


def test_a_trace_needs_the_meter(tmp_path):
    with pytest.raises(ConfigError, match="metered=True"):
        run_contenders([], BenchConfig(metered=False), trace_dir=tmp_path)
