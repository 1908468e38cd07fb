"""fastdata.meter: verdicts from real timed loops (tiny sleeps, no absolute speed asserted), bad input, the
report's shape, system figures (and their absence), per-stage attribution of fastdata's loader, and no verdict
before there is a measured window. The diagnosis of each bottleneck from made-up figures: test_report.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import fastdata
from fastdata.meter.loop import _Timeline, infer_batch_size
from fastdata.meter.stages import STAGES


def sleepy(count: int, delay: float, batch: int = 4):
    """A loader that takes `delay` seconds per batch of `batch` samples."""
    for i in range(count):
        if delay:
            time.sleep(delay)
        yield torch.full((batch, 3), i), torch.arange(batch)


def run(metered, step: float) -> None:
    for _ in metered:
        time.sleep(step)


def test_loader_slower_than_step_is_input_bound():
    m = fastdata.meter(sleepy(12, 0.02), interval=0.05)
    run(m, 0.0)  # a step that does nothing: on a loaded machine a sleeping step can overshoot by milliseconds
    r = m.report()
    assert r.verdict == "input-bound", r
    assert r.data_wait_fraction > 0.5
    assert r.steps == 12 and r.samples == 48
    assert r.measured_steps == 11 and r.warmup_steps == 1
    assert r.samples_per_s > 0 and r.steps_per_s > 0
    assert r.reasons[0].startswith("the loop waited for data")
    assert r.suggestions


def test_step_slower_than_loader_is_compute_bound():
    m = fastdata.meter(sleepy(12, 0.0), system=False)  # other jobs on a busy machine would be named instead
    run(m, 0.02)
    r = m.report()
    assert r.verdict == "compute-bound", r
    assert r.data_wait_fraction < 0.2
    assert "keeps up" in r.reasons[0]
    assert any("speed up the step" in s for s in r.suggestions)


def test_warm_up_batch_is_left_out_of_the_rates():
    def slow_start():
        time.sleep(0.15)
        yield from sleepy(10, 0.0)

    m = fastdata.meter(slow_start(), system=False)
    run(m, 0.01)
    r = m.report()
    assert r.first_batch_s >= 0.15
    assert r.verdict == "compute-bound", r
    assert r.seconds > r.measured_seconds + 0.1


def test_items_come_through_unchanged_over_several_passes():
    items = [object(), {"x": np.zeros((2, 2))}, (1, 2), "text", None]
    m = fastdata.meter(items, system=False)
    assert len(m) == len(items)
    for _ in range(2):
        seen = list(m)
        assert len(seen) == len(items) and all(a is b for a, b in zip(seen, items, strict=True))
    r = m.report()
    assert r.steps == 2 * len(items)


@pytest.mark.parametrize("bad", [3, 4.5, object(), None])
def test_not_iterable_is_a_type_error(bad):
    with pytest.raises(TypeError, match="needs an iterable"):
        fastdata.meter(bad)


def test_empty_iterable_says_no_steps_measured():
    m = fastdata.meter([], system=False)
    assert list(m) == []
    r = m.report()
    assert r.steps == 0 and r.verdict == "no steps measured" and r.verdict != "balanced"
    assert "no steps measured" in str(r)
    assert "no steps measured" in r.reasons[0]
    json.dumps(r.to_dict())


def test_report_before_any_iteration_says_no_steps_measured():
    r = fastdata.meter(iter([1, 2]), system=False).report()
    assert r.steps == 0 and r.verdict == "no steps measured"


@pytest.mark.parametrize("bad", [{"log_every": 0}, {"warmup_steps": -1}, {"batch_size": 0}])
def test_bad_options(bad):
    with pytest.raises(ValueError):
        fastdata.meter([1], **bad)


@pytest.mark.parametrize(("item", "size"), [
    (torch.zeros(7, 3), 7),
    (np.zeros((5, 2)), 5),
    ((torch.zeros(6, 3, 8, 8), torch.zeros(6)), 6),
    ([np.zeros((3,)), "x"], 3),
    ({"input_ids": torch.zeros(9, 4), "mask": torch.zeros(9, 4)}, 9),
    ({"nested": (torch.zeros(2, 1),)}, 2),
    (torch.tensor(3.0), None),
    ("string", None),
    ((), None),
    (12, None),
])
def test_infer_batch_size(item, size):
    assert infer_batch_size(item) == size


def test_batch_size_given_or_unknown():
    m = fastdata.meter(range(6), batch_size=32, system=False)
    run(m, 0.0)
    assert m.report().samples == 6 * 32
    m = fastdata.meter(["ab", "cde"], batch_size=len, system=False)
    run(m, 0.0)
    assert m.report().samples == 5
    m = fastdata.meter(range(4), system=False)
    run(m, 0.001)
    r = m.report()
    assert r.samples is None and r.samples_per_s is None and r.steps == 4
    assert "samples/s" not in str(r) and "steps/s" in str(r)


def test_live_log_line():
    lines: list[str] = []
    m = fastdata.meter(sleepy(9, 0.002), log_every=4, log=lines.append, interval=0.05)
    run(m, 0.001)
    assert len(lines) == 2
    assert lines[0].startswith("[fastdata.meter] step 4")
    for part in ("steps/s", "samples/s", "data wait", "CPU", "GPU"):
        assert part in lines[1]


def test_report_to_dict_is_json_and_str_is_readable():
    m = fastdata.meter(sleepy(8, 0.005), interval=0.05)
    run(m, 0.001)
    r = m.report()
    d = json.loads(json.dumps(r.to_dict()))
    for key in ("steps", "samples", "seconds", "samples_per_s", "data_wait_s", "data_wait_fraction", "verdict",
                "reasons", "suggestions", "system", "timeline"):
        assert key in d
    assert d["verdict"] == r.verdict
    assert sum(d["timeline"]["samples_per_s"]) > 0
    text = str(r)
    assert r.verdict in text and "data wait" in text and "why" in text


def test_break_out_early_and_report_mid_loop():
    m = fastdata.meter(sleepy(100, 0.001), interval=0.05)
    for i, _ in enumerate(m):
        if i == 3:
            mid = m.report()
            assert mid.steps == 4
        if i == 5:
            break
    r = m.report()
    assert r.steps == 6
    assert not m._sampler.running  # the pass ended with the break


def test_system_figures_are_sampled():
    psutil = pytest.importorskip("psutil")  # a core dependency: always there
    m = fastdata.meter(sleepy(10, 0.01), interval=0.05)
    run(m, 0.002)
    s = m.report().system
    assert s["samples"] >= 1
    assert 0 <= s["cpu_percent"] <= 100
    assert len(s["cpu_per_core_percent"]) == psutil.cpu_count()
    assert s["rss_mb"] > 1
    assert s["main_cpu_cores"] is not None and s["workers_cpu_cores"] is not None
    if sys.platform.startswith("linux"):
        assert s["iowait_percent"] is not None
    if not torch.cuda.is_available():
        assert s["gpu_util_percent"] is None
        assert s["unavailable"]["gpu_util_percent"]


def test_without_psutil_figures_are_none_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # `import psutil` raises ImportError
    m = fastdata.meter(sleepy(5, 0.01), interval=0.05)
    run(m, 0.001)
    r = m.report()
    assert r.system["cpu_percent"] is None and r.system["rss_mb"] is None
    assert "psutil is not installed" in r.system["unavailable"]["cpu_percent"]
    assert r.verdict == "input-bound"
    assert "n/a" in str(r)


def test_a_failing_process_reading_loses_figures_not_the_loop(monkeypatch):
    psutil = pytest.importorskip("psutil")

    def refuse(self):
        raise RuntimeError("no /proc for you")

    monkeypatch.setattr(psutil.Process, "cpu_times", refuse)
    m = fastdata.meter(sleepy(6, 0.01), interval=0.02)
    run(m, 0.001)
    r = m.report()
    assert r.steps == 6 and r.verdict == "input-bound"
    assert r.system["rss_mb"] is None and "could not read process" in r.system["unavailable"]["rss_mb"]
    assert r.system["cpu_percent"] is not None  # the other figures still came


def test_without_nvml_gpu_figures_are_none_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    m = fastdata.meter(sleepy(10, 0.02), interval=0.02)  # a run of several sampling intervals, even on a busy machine
    run(m, 0.001)
    r = m.report()
    assert r.system["gpu_util_percent"] is None
    assert "NVML is not installed" in r.system["unavailable"]["gpu_util_percent"]
    assert any("no GPU figures" in reason for reason in r.reasons)


@pytest.mark.parametrize("workers", [0, 2])
def test_fastdata_loader_per_stage_attribution(solid_lmdb, workers):
    loader = fastdata.loader(solid_lmdb, batch_size=8, image_size=32, num_workers=workers, pin_memory=False)
    m = fastdata.meter(loader, interval=0.05)
    for _ in range(2):
        run(m, 0.0)
    r = m.report()
    assert r.loader["kind"] == "fastdata.loader" and r.loader["num_workers"] == workers
    assert r.samples == 2 * len(loader.dataset)
    stages = r.stages
    assert set(stages["seconds"]) == set(STAGES)
    assert stages["batches"] == 2 * len(loader)
    assert stages["seconds"]["decode"] > 0 and stages["seconds"]["read"] > 0
    assert stages["seconds"]["collate"] > 0 and stages["seconds"]["augment"] > 0
    assert stages["seconds"]["transfer"] == 0  # nothing pinned
    assert sum(stages["share"].values()) == pytest.approx(1.0, abs=1e-3)
    assert any(reason.startswith("loader time by stage") for reason in r.reasons)
    assert "stages" in str(r)
    if workers:  # the sampler found the worker processes and their CPU time
        assert r.system["workers"] >= workers and r.system["workers_cpu_cores"] > 0


def test_torch_dataloader_facts():
    data = torch.utils.data.TensorDataset(torch.zeros(10, 2), torch.zeros(10))
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=0)
    m = fastdata.meter(loader, system=False)
    run(m, 0.0)
    r = m.report()
    assert r.loader == {"kind": "torch DataLoader", "type_name": "DataLoader", "num_workers": 0,
                        "pin_memory": False, "batch_size": 4, "dataset": "TensorDataset", "folder_of_files": False,
                        "decode": None, "progressive": None, "not_jpeg": None, "stored": None,
                        "largest_side": None}
    assert r.samples == 10 and r.stages is None


def test_timeline_bins_stay_bounded_and_split_long_waits():
    t = _Timeline(width=0.1, max_bins=8)
    t.add(0.0, 0.25, 4)  # a wait over three bins
    assert t.wait[:3] == pytest.approx([0.1, 0.1, 0.05])
    assert t.samples[2] == 4
    for i in range(1, 40):
        t.add(i * 0.1, i * 0.1 + 0.01, 4)
    assert len(t.steps) <= 8 and t.width > 0.1
    assert sum(t.steps) == 40 and sum(t.samples) == 160
    d = t.as_dict()
    assert len(d["t"]) == len(d["samples_per_s"]) == len(d["data_wait_fraction"])
    assert all(0 <= f <= 1 for f in d["data_wait_fraction"])


@pytest.mark.cuda
def test_cuda_events_time_the_gpu_view():
    device = torch.device("cuda")
    weights = torch.randn(2048, 2048, device=device)

    def gpu_heavy_step(x):
        for _ in range(20):
            x = x @ weights
        return x

    batches = [torch.randn(512, 2048) for _ in range(30)]
    m = fastdata.meter(batches, interval=0.05)  # sync=None: CUDA is in use by the first step's end
    for batch in m:
        gpu_heavy_step(batch.to(device, non_blocking=True))
    r = m.report()
    assert r.timed_on == "cuda-events"
    assert r.verdict == "compute-bound" and r.data_wait_fraction < 0.2
    assert r.system["gpu_util_percent"] is not None or r.system["unavailable"]["gpu_util_percent"]

    m = fastdata.meter(sleepy(12, 0.02), sync=True)
    for x, _ in m:
        x.to(device).float().sum()
    r = m.report()
    assert r.timed_on == "cuda-events" and r.verdict == "input-bound" and r.data_wait_fraction > 0.8


# A busy loop (for at most two minutes, should the test never end it), and a starter that runs `count` of them in
# a session of its own and exits: they are then no descendants of the metered process, i.e. "other processes".
SPIN = textwrap.dedent("""
    import time
    print("spinning", flush=True)
    end = time.time() + 120
    while time.time() < end:
        pass
""")
HOGS = textwrap.dedent("""
    import os, subprocess, sys
    os.setsid()
    print(os.getpgid(0), flush=True)
    for _ in range(int(sys.argv[1])):
        subprocess.Popen([sys.executable, "-c", sys.argv[2]])
""")


@pytest.fixture
def cpu_hogs():
    """Busy loops in other processes (not descendants of this one), two per core, for the test's duration."""
    count = 2 * (os.cpu_count() or 1)
    starter = subprocess.Popen([sys.executable, "-c", HOGS, str(count), SPIN], stdout=subprocess.PIPE, text=True)
    group = int(starter.stdout.readline())
    try:
        said = ""
        while said.count("spinning") < count:  # every hog is in its loop (their lines may interleave)
            char = starter.stdout.read(1)
            assert char, f"the hogs ended early: {said!r}"
            said += char
        yield count
    finally:
        os.killpg(group, signal.SIGKILL)
        starter.wait()
        starter.stdout.close()


def test_a_loop_slowed_by_other_processes_is_reported_as_such(cpu_hogs):
    """A real CPU-bound loop (data always ready) beside busy loops in other processes: the report names the CPU
    they took and does not call the loop compute-bound (no figures asserted beyond the verdict's own rule)."""
    m = fastdata.meter(list(range(100)), interval=0.1)
    for _ in m:
        sum(range(200_000))  # the step: CPU work of this process
    r = m.report()
    assert r.system["others_cpu_cores"] is not None
    assert r.verdict == "cpu-contended", str(r)
    assert "other processes took" in r.reasons[0]
    assert not any("mixed precision" in s for s in r.suggestions)
    assert "other processes" in str(r)


def test_epoch_start_stalls_are_reported_on_their_own_line():
    """Three passes whose first batch comes late: the later two passes' first waits are the epoch-start line."""

    class SlowStart:
        def __iter__(self):
            time.sleep(0.3)
            for _ in range(3):
                yield torch.zeros(2)

    m = fastdata.meter(SlowStart(), system=False)
    for _ in range(3):
        for _ in m:
            pass
    r = m.report()
    assert r.epoch_starts["passes"] == 2 and r.epoch_starts["mean_s"] >= 0.3
    assert any(line.startswith("epoch starts: 2 later passes began after a wait of") for line in r.reasons)


def test_memory_is_the_main_rss_plus_the_workers_own_pages(tmp_path):
    """Forked workers share the parent's pages: the meter adds each worker's USS, not its RSS, to the main RSS."""
    import multiprocessing

    import psutil

    from fastdata.meter.system import _unique_bytes

    big = bytearray(200 * 2**20)  # 200 MB in the parent, shared with a forked child until written
    big[::4096] = b"x" * len(big[::4096])
    ready, done = multiprocessing.get_context("fork").Event(), multiprocessing.get_context("fork").Event()

    def child() -> None:
        ready.set()
        done.wait(60)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    try:
        assert ready.wait(60)
        worker = psutil.Process(process.pid)
        assert worker.memory_info().rss > 150 * 2**20  # its RSS counts the parent's 200 MB again
        assert _unique_bytes(worker) < 100 * 2**20  # its own pages do not
    finally:
        done.set()
        process.join(60)
    del big


@pytest.mark.parametrize(("steps", "warmup", "measured"), [(1, 1, 0), (2, 1, 1), (3, 1, 2), (2, 0, 2),
                                                           (5, 3, 2)])
def test_no_verdict_before_enough_steps_and_the_report_says_what_is_missing(steps, warmup, measured):
    """The first `warmup_steps` are left out (worker start-up): with fewer than 3 steps after them there is no
    verdict, and the report says how many came, how many were measured and how many to run."""
    m = fastdata.meter(range(steps), warmup_steps=warmup, system=False)
    for _ in m:
        pass
    r = m.report()
    assert r.verdict == "too few steps"
    assert r.reasons[0].startswith(f"{steps} step{'s' * (steps != 1)} in all, {measured} after the warm-up")
    assert "a verdict needs at least 3 measured steps" in r.reasons[0]
    assert r.suggestions == [f"run at least {warmup + 3} steps before reading the report (more for steady figures: "
                             "a few hundred, or a whole epoch)"]
    assert str(r).startswith("fastdata.meter: too few steps")
    json.dumps(r.to_dict())


def test_a_verdict_from_three_measured_steps_on():
    m = fastdata.meter(sleepy(4, 0.01), system=False)
    for _ in m:
        pass
    assert m.report().verdict == "input-bound"
