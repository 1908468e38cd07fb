"""fastdata.meter's timeline trace (`trace=`): the file is the Chrome Trace Event Format (checked against a JSON
schema of it, events in time order, durations >= 0, every process and track named), fastdata's loader workers'
batch spans land on the training process's clock (each batch ends before the step that received it stops
waiting), the trace stays bounded and is written atomically; the logging hooks (`on_log=`, the TensorBoard and
Lightning adapters, read back with the real libraries); and the straggler line of a real two-process gloo job in
which one rank is slowed on purpose."""

from __future__ import annotations

import csv
import json
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from builders.trace import check_trace, perfetto_ns

import fastdata
from fastdata.meter.ranks import compare_ranks, ranks_line
from fastdata.meter.stages import StageTimes
from fastdata.meter.trace import COUNTERS, LOADER_TID, WORKER_STAGES, Tracer, rank_path


def spans(trace: dict, name: str, loop: bool = False) -> list[dict]:
    """The spans named `name` (with `loop`: on the training loop's track, the main thread's, tid = pid)."""
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == name
            and (not loop or e["tid"] == e["pid"])]


def test_a_plain_iterable_gets_step_spans_and_counters(tmp_path):
    def slow(n):
        for i in range(n):
            time.sleep(0.01)
            yield torch.zeros(2, 3) + i

    path = tmp_path / "out" / "run.json"
    with fastdata.meter(slow(8), trace=path, interval=0.02) as m:
        for _ in m:
            time.sleep(0.005)
        assert m.trace_path == path
    trace = check_trace(path)
    waits, computes = spans(trace, "data wait", loop=True), spans(trace, "compute", loop=True)
    assert [e["args"]["step"] for e in waits] == list(range(1, 9))
    assert [e["args"]["step"] for e in computes] == list(range(1, 9))
    for wait, compute in zip(waits, computes, strict=True):  # each step: its wait, then its compute
        assert compute["ts"] >= wait["ts"] + wait["dur"] - 0.01
    assert not [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] != e["pid"]]  # no loader workers
    counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert "CPU busy" in counters and counters <= {track for track, _ in COUNTERS.values()}
    assert trace["otherData"]["dropped_events"] == 0 and "CLOCK_MONOTONIC" in trace["otherData"]["clock"]
    assert m.report().trace == str(path)
    assert f"trace        {path}" in str(m.report())
    assert not list(path.parent.glob(".*tmp"))  # written through a temporary file, renamed


@pytest.mark.parametrize("workers", [0, 2])
def test_fastdata_loader_worker_spans_share_the_loops_clock(solid, tmp_path, workers):
    loader = fastdata.loader(solid, batch_size=4, augment="train", image_size=16, num_workers=workers)
    path = tmp_path / "loader.json"
    m = fastdata.meter(loader, trace=path, interval=0.05)
    for _ in range(2):  # two passes: the file is rewritten with both
        for _ in m:
            pass
    m.close()
    assert loader.trace_sink is None  # unhooked after each pass
    trace = check_trace(path)
    steps = 2 * len(loader)
    waits = spans(trace, "data wait", loop=True)
    assert len(waits) == steps
    batches = spans(trace, "batch")
    assert len(batches) == steps
    tids = {e["tid"] for e in batches}
    assert tids == ({LOADER_TID} if workers == 0 else {w + 1 for w in range(workers)})
    thread_names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert all(("worker" in thread_names[t]) == (workers > 0) for t in tids)
    ends = sorted((e["args"]["received"], e["ts"] + e["dur"]) for e in batches)
    assert [n for n, _ in ends] == list(range(1, steps + 1))
    for (n, end), wait in zip(ends, waits, strict=True):  # made in another process, on one clock
        assert wait["args"]["step"] == n
        assert end <= wait["ts"] + wait["dur"] + 1.0, f"batch {n} ended after the step that received it"
    for stage in WORKER_STAGES:
        assert spans(trace, stage), f"no {stage} spans"
    for batch in batches:  # the stages inside their batch, one after another
        inside = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == batch["tid"]
                  and e["name"] in WORKER_STAGES and batch["ts"] <= e["ts"] < batch["ts"] + batch["dur"]]
        assert inside and all(e["ts"] + e["dur"] <= batch["ts"] + batch["dur"] + 0.01 for e in inside)


def test_the_trace_stays_bounded_and_says_so(tmp_path):
    path = tmp_path / "capped.json"
    with fastdata.meter(range(50), trace=path, trace_max_events=30, system=False, batch_size=1) as m:
        for _ in m:
            pass
    trace = check_trace(path)
    other = trace["otherData"]
    assert other["events"] == 30 and other["max_events"] == 30
    assert other["dropped_events"] == 2 * 50 - 30  # a data wait and a compute per step
    assert "first 30 events" in other["note"]


def test_tracer_stages_fit_in_their_batch_and_rank_paths(tmp_path):
    tracer = Tracer(tmp_path / "t.json")
    times = StageTimes(read=0.002, decode=0.004, augment=0.003, collate=0.5)  # more than the batch took
    tracer.worker_batch((3, 10_000_000, 20_000_000), times)  # 10 ms
    tracer.worker_batch(None, times)  # a batch made without a span: nothing drawn
    trace = check_trace(tracer.write())
    assert trace["otherData"]["origin_monotonic_ns"] == 10_000_000  # microseconds from there
    batch = spans(trace, "batch")[0]
    assert (batch["tid"], perfetto_ns(batch["ts"]), perfetto_ns(batch["dur"])) == (4, 0, 10_000_000)
    stages = [(e["name"], perfetto_ns(e["ts"]), perfetto_ns(e["dur"])) for e in trace["traceEvents"]
              if e["name"] in WORKER_STAGES]
    assert stages == [("read", 0, 2_000_000), ("decode", 2_000_000, 4_000_000), ("augment", 6_000_000, 3_000_000),
                      ("collate", 9_000_000, 1_000_000)]  # clamped at the batch's end
    assert rank_path("run.json", None, 1) == Path("run.json")
    assert rank_path("out/run.json", 1, 2) == Path("out/run.rank1.json")
    assert rank_path("out/run", 0, 4) == Path("out/run.rank0.json")
    with pytest.raises(ValueError, match="trace_max_events"):
        fastdata.meter([1], trace=tmp_path / "x.json", trace_max_events=0)


# -------------------------------------------------------------------------------------------------
# logging hooks


def batches(n: int, size: int = 4):
    for i in range(n):
        yield torch.full((size, 2), i)


def test_on_log_gets_the_figures_every_n_steps_and_no_lines(capsys):
    got: list[dict] = []
    m = fastdata.meter(batches(10), log_every=3, on_log=got.append, interval=0.01)
    for step, _ in enumerate(m, start=1):
        time.sleep(0.002)
        if step == 4:  # let the sampler take a sample before step 6's figures
            deadline = time.monotonic() + 30
            while not m._sampler.latest and time.monotonic() < deadline:
                time.sleep(0.005)
    assert [f["step"] for f in got] == [3, 6, 9]
    loop_figures = {"step", "seconds", "steps_per_s", "samples_per_s", "data_wait_fraction"}
    for figures in got:
        assert loop_figures <= set(figures) <= loop_figures | set(COUNTERS)  # the documented names
        assert 0.0 <= figures["data_wait_fraction"] <= 1.0 and figures["samples_per_s"] > 0
        assert all(value is not None for value in figures.values())
    assert "cpu_percent" in got[1] and "rss_mb" in got[1]  # the last system sample
    assert capsys.readouterr().err == ""  # with on_log and no log, no lines
    lines: list[str] = []
    m = fastdata.meter(batches(4), log_every=2, on_log=got.append, log=lines.append, system=False)
    list(m)
    assert len(lines) == 2 and lines[0].startswith("[fastdata.meter] step 2")
    with pytest.raises(TypeError, match="on_log"):
        fastdata.meter([1], on_log="print")


def test_tensorboard_adapter_writes_scalars_read_back(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra (pip install fastdata[tensorboard])")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path))
    m = fastdata.meter(batches(6), log_every=2, on_log=fastdata.meter.tensorboard(writer), system=False)
    for _ in m:
        time.sleep(0.001)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"fastdata/data_wait_fraction", "fastdata/samples_per_s", "fastdata/steps_per_s"} <= tags
    assert "fastdata/step" not in tags
    assert [e.step for e in events.Scalars("fastdata/samples_per_s")] == [2, 4, 6]
    assert all(0.0 <= e.value <= 1.0 for e in events.Scalars("fastdata/data_wait_fraction"))
    with pytest.raises(TypeError, match="SummaryWriter"):
        fastdata.meter.tensorboard(object())


def test_lightning_adapter_logs_metrics_read_back(tmp_path):
    loggers = pytest.importorskip("lightning.pytorch.loggers", reason="the lightning extra")
    logger = loggers.CSVLogger(str(tmp_path), name="run", version=0)
    m = fastdata.meter(batches(6), log_every=3, on_log=fastdata.meter.lightning(logger, prefix="data/"),
                       system=False)
    list(m)
    logger.save()
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [3, 6]
    assert all(float(r["data/samples_per_s"]) > 0 for r in rows)
    assert all(0.0 <= float(r["data/data_wait_fraction"]) <= 1.0 for r in rows)
    with pytest.raises(TypeError, match="Lightning logger"):
        fastdata.meter.lightning(object())


# -------------------------------------------------------------------------------------------------
# ranks


def test_compare_ranks_names_a_straggler_only_when_it_stands_out():
    def ranks(*waits):
        return [{"data_wait_fraction": w, "samples_per_s": 10.0, "steps": 5} for w in waits]

    two = compare_ranks(ranks(0.03, 0.41), rank=0)
    assert two["straggler"] == 1 and two["slowest"] == 1
    assert ranks_line(two) == "straggler: rank 1, data wait 41% vs median 3% of the other 1 rank"
    four = compare_ranks(ranks(0.02, 0.05, 0.30, 0.04), rank=3)
    assert four["straggler"] == 2 and four["others_median_data_wait_fraction"] == 0.04
    assert "of the other 3 ranks" in ranks_line(four)
    even = compare_ranks(ranks(0.02, 0.05, 0.08), rank=1)
    assert even["straggler"] is None and even["slowest"] == 2
    assert ranks_line(even) == "no straggler: data wait 2% to 8% over 3 ranks (slowest rank 2)"
    tie = compare_ranks(ranks(0.5, 0.5), rank=0)
    assert tie["straggler"] is None and tie["slowest"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, out: str) -> None:
    """One rank of a gloo job: rank 1's batches come slowly (a sleep in its iterable), rank 0's step is slow;
    both meter their loop with a trace and write their report."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        def data():
            for i in range(12):
                if rank == 1:
                    time.sleep(0.03)
                yield torch.full((2, 3), i)

        m = fastdata.meter(data(), trace=Path(out) / "run.json", interval=0.05)
        for _ in m:
            if rank != 1:
                time.sleep(0.03)
        m.close()
    finally:
        dist.destroy_process_group()
    report = m.report()  # not a collective: the ranks were compared at the end of the pass
    Path(out, f"report{rank}.json").write_text(json.dumps({"dict": report.to_dict(), "text": str(report)}))


def test_two_ranks_name_the_slowed_one_as_straggler(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_rank_main, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="fork")
    for rank in range(2):
        saved = json.loads((tmp_path / f"report{rank}.json").read_text())
        ranks = saved["dict"]["ranks"]
        assert ranks["rank"] == rank and ranks["world_size"] == 2
        assert ranks["straggler"] == 1, ranks
        assert ranks["data_wait_fraction"][1] > ranks["data_wait_fraction"][0]
        assert "straggler: rank 1, data wait" in saved["text"]
        assert saved["dict"]["suggestions"][0].startswith("rank 1 holds every rank up")
        trace = check_trace(tmp_path / f"run.rank{rank}.json")
        assert trace["otherData"]["rank"] == rank and trace["otherData"]["world_size"] == 2
        assert len(spans(trace, "data wait")) == 12
        process = next(e for e in trace["traceEvents"] if e["name"] == "process_name")
        assert f"rank {rank}" in process["args"]["name"]
    assert not (tmp_path / "run.json").exists()
