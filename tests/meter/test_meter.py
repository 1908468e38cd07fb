"""fastdata.meter: verdicts from real timed loops (tiny sleeps, no absolute speed asserted), bad input, the
report's shape, system figures (and their absence), per-stage attribution of fastdata's loader, and the
diagnosis of each bottleneck from made-up figures."""

from __future__ import annotations

import dataclasses
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
from fastdata.meter.report import LoaderFacts, diagnose
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


# ---------------------------------------------------------------------------------------------------
# diagnosis from made-up figures

FOLDER = LoaderFacts("torch DataLoader", "DataLoader", num_workers=2, pin_memory=False, batch_size=64,
                     dataset="ImageFolder", folder_of_files=True)
FASTDATA = LoaderFacts("fastdata.loader", "ImageLoader", num_workers=8, pin_memory=True, batch_size=256,
                       dataset="fastdata lmdb")


def system(**figures):
    base = {"cores": 8, "cpu_percent": 40.0, "iowait_percent": 1.0, "disk_read_mb_s": 5.0, "workers": 2,
            "workers_cpu_cores": 2.0, "main_cpu_cores": 0.5, "gpu_util_percent": None,
            "unavailable": {"gpu_util_percent": "NVML sees no GPU"}}
    return {**base, **figures}


def stages(**shares):
    share = {name: shares.get(name, 0.0) for name in STAGES}
    return {"seconds": {k: v * 10 for k, v in share.items()}, "share": share, "worker_seconds": 10.0, "batches": 9}


def judge(fraction, sysf, stage=None, loader=FOLDER, cuda=False):
    return diagnose(steps=100, wait_fraction=fraction, wait_s=fraction * 10, seconds=10.0, system=sysf,
                    stages=stage, loader=loader, cuda=cuda)


def test_diagnose_decode_bound_as_in_the_issue():
    verdict, reasons, suggestions = judge(0.63, system(cores=2, cpu_percent=98.0, workers_cpu_cores=2.0,
                                                       main_cpu_cores=0.1))
    assert verdict == "input-bound"
    assert reasons[0].startswith("the loop waited for data 63% of the time")
    assert "2 workers used 2.0 of 2 cores" in reasons[0] and "iowait 1%" in reasons[0]
    assert reasons[0].endswith("decoding and augmenting on the CPU is the bottleneck (the CPU is saturated)")
    assert any("fastdata convert imagefolder" in s for s in suggestions)
    assert any("--max-size" in s for s in suggestions)


def test_diagnose_names_the_stage_that_is_the_wall():
    _, reasons, suggestions = judge(0.7, system(cpu_percent=97.0, workers_cpu_cores=7.8), loader=FASTDATA,
                                    stage=stages(read=0.05, decode=0.7, augment=0.15, collate=0.1))
    assert reasons[0].endswith("decoding is the bottleneck (70% of worker time)")
    assert reasons[1].startswith("loader time by stage: decode 70%, augment 15%, collate 10%, read 5%")
    assert not any("fastdata convert imagefolder SRC" in s for s in suggestions)  # already packed
    assert any("--max-size" in s for s in suggestions)


def test_diagnose_storage_bound():
    verdict, reasons, suggestions = judge(0.5, system(iowait_percent=45.0, cpu_percent=30.0))
    assert verdict == "input-bound"
    assert "reading from storage is the bottleneck" in reasons[0]
    assert any("LMDB" in s for s in suggestions)
    _, reasons, suggestions = judge(0.5, system(iowait_percent=2.0), loader=FASTDATA, stage=stages(read=0.6,
                                                                                                   decode=0.4))
    assert "reading from storage" in reasons[0] and any("local SSD" in s for s in suggestions)


def test_diagnose_too_few_workers_and_in_process():
    _, reasons, suggestions = judge(0.6, system(cpu_percent=30.0, workers_cpu_cores=1.9))
    assert "too few workers: 2 busy workers on 8 cores" in reasons[0]
    assert any("raise num_workers from 2 to 8" in s for s in suggestions)
    in_process = LoaderFacts("torch DataLoader", "DataLoader", num_workers=0, pin_memory=False)
    _, reasons, suggestions = judge(0.6, system(cpu_percent=15.0, workers=0, workers_cpu_cores=0.0,
                                                main_cpu_cores=1.0), loader=in_process)
    assert "inside the training process" in reasons[0]
    assert any("num_workers=8" in s for s in suggestions)


def test_diagnose_contention_and_waiting_on_something_else():
    _, reasons, _ = judge(0.6, system(cpu_percent=99.0, workers_cpu_cores=0.5, main_cpu_cores=0.2))
    assert "the CPU is saturated, mostly by others: other processes took 7.2 of the machine's 8 cores" in reasons[0]
    plain = LoaderFacts("iterable", "generator")
    _, reasons, _ = judge(0.9, system(cpu_percent=10.0, workers=0, workers_cpu_cores=0.0, main_cpu_cores=0.05),
                          loader=plain)
    assert "waits on something outside it" in reasons[0]


def test_diagnose_compute_bound_with_an_idle_gpu_and_pin_memory():
    verdict, reasons, suggestions = judge(0.02, system(gpu_util_percent=30.0), cuda=True)
    assert verdict == "compute-bound" and "GPU 30% busy" in reasons[-1]
    assert "torch.compile" in suggestions[0]
    verdict, _, suggestions = judge(0.2, system(cpu_percent=20.0, workers_cpu_cores=1.9), cuda=True)
    assert verdict == "balanced"
    assert any(s.startswith("pin_memory=True") for s in suggestions)


def test_diagnose_without_system_figures():
    verdict, reasons, _ = judge(0.9, None, loader=LoaderFacts("iterable", "list"))
    assert verdict == "input-bound"
    assert reasons[0].startswith("the loop waited for data 90% of the time")


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


def test_diagnose_other_processes_taking_the_cpu_are_not_blamed_on_the_model():
    """Data is there (2% wait) but the machine is saturated and most of it went to other processes: the verdict
    says so, and the suggestions do not send the user tuning the model."""
    busy = system(cores=2, cpu_percent=99.0, cpu_per_core_percent=[99.0, 99.0], workers=0, workers_cpu_cores=0.0,
                  main_cpu_cores=0.7, others_cpu_cores=1.28)
    verdict, reasons, suggestions = judge(0.02, busy, cuda=True)
    assert verdict == "cpu-contended"
    assert "other processes used 1.3 cores" in reasons[0]
    assert reasons[0].endswith("but other processes took 1.3 of the machine's 2 cores (CPU 99% busy) while this "
                               "job used 0.7: the step is slowed by them, so its pace says little about the model "
                               "or the loader")
    assert suggestions and all("mixed precision" not in s and "torch.compile" not in s for s in suggestions)
    assert "cores to itself" in suggestions[0]
    # the same loop with the machine to itself: compute-bound, and the step is what to speed up
    alone = {**busy, "cpu_percent": 40.0, "cpu_per_core_percent": [40.0, 40.0], "others_cpu_cores": 0.1}
    verdict, reasons, suggestions = judge(0.02, alone)
    assert verdict == "compute-bound" and "keeps up" in reasons[0] and "other processes took" not in reasons[0]
    assert any("mixed precision" in s for s in suggestions)


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


# ------------------------------------------------------------------------------ the device path (issue 29)

DEVICE = LoaderFacts("fastdata.loader", "ImageLoader", num_workers=16, pin_memory=True, batch_size=256,
                     dataset="fastdata lmdb", decode="device")
WORKER_DECODE = LoaderFacts("fastdata.loader", "ImageLoader", num_workers=16, pin_memory=True, batch_size=256,
                            dataset="fastdata lmdb", decode="worker")


def test_the_training_process_is_named_as_the_wall():
    """The main process near one full core, 16 workers nearly idle, the loop waiting: the training process is the
    wall, and on the device path the advice is to decode in the workers (or let tune decide), not on the GPU."""
    sysf = system(cores=16, cpu_percent=12.0, workers_cpu_cores=0.9, main_cpu_cores=1.0)
    verdict, reasons, suggestions = judge(0.6, sysf, loader=DEVICE, cuda=True)
    assert verdict == "input-bound"
    assert "the training process is the wall: it used 1.0 cores" in reasons[0] and "device feeder" in reasons[0]
    assert any('decode="worker"' in s for s in suggestions)
    assert not any('decode=\\"device\\"' in s or 'decode="device"`' in s for s in suggestions)


def test_decode_advice_knows_the_loaders_placement():
    sysf = system(cores=8, cpu_percent=97.0, workers_cpu_cores=7.8, main_cpu_cores=0.2)
    decode_bound = stages(read=0.05, decode=0.7, augment=0.15, collate=0.1)
    _, _, on_workers = judge(0.7, sysf, stage=decode_bound, loader=WORKER_DECODE, cuda=True)
    _, _, on_device = judge(0.7, sysf, stage=decode_bound, loader=DEVICE, cuda=True)
    assert any('decode=\"device\"' in s for s in on_workers)
    assert not any('decode=\"device\"`' in s for s in on_device)


def test_decode_bound_workers_over_progressive_jpegs_are_told_of_the_baseline_layout():
    """A worker-path loader, decode-bound, whose dataset stores progressive JPEGs (at least 1% of its images) is
    told to re-convert with --jpeg-layout baseline; under 1%, or none known, it is not."""
    sysf = system(cores=8, cpu_percent=97.0, workers_cpu_cores=7.8, main_cpu_cores=0.2)
    decode_bound = stages(read=0.05, decode=0.7, augment=0.15, collate=0.1)
    for progressive, told in ((57, True), (9, False), (None, False)):
        facts = dataclasses.replace(WORKER_DECODE, progressive=progressive, stored=1000)
        _, _, suggestions = judge(0.7, sysf, stage=decode_bound, loader=facts, cuda=False)
        advice = [s for s in suggestions if "--jpeg-layout baseline" in s]
        assert bool(advice) == told, (progressive, suggestions)
        if told:
            assert advice[0].startswith("6% of the stored images (57) are progressive JPEGs")


def test_the_device_feeder_as_a_stage_can_be_the_wall():
    _, reasons, suggestions = judge(0.5, system(cpu_percent=30.0, workers_cpu_cores=2.0, main_cpu_cores=0.6),
                                    stage=stages(read=0.1, device=0.85, collate=0.05), loader=DEVICE, cuda=True)
    assert "the device feeder (decode and crop on the device) is the bottleneck (85%" in reasons[0]
    assert "device: the feeder thread" in reasons[1]
    assert any("nvImageCodec" in s for s in suggestions)
    assert not any("decode_ahead" in s for s in suggestions)  # gone: the feeder always decodes ahead
    assert not any("progressive" in s for s in suggestions)  # nothing known of progressive files
    with_progressive = dataclasses.replace(DEVICE, progressive=19)
    _, _, suggestions = judge(0.5, system(cpu_percent=30.0, workers_cpu_cores=2.0, main_cpu_cores=0.6),
                              stage=stages(read=0.1, device=0.85, collate=0.05), loader=with_progressive, cuda=True)
    assert any("19 progressive JPEGs" in s and "--jpeg-layout baseline" in s for s in suggestions)


def test_the_device_feeders_threads_and_streams_are_in_the_report():
    """decode="device": per batch, each feeder thread's busy and waiting milliseconds and each stream's GPU time;
    the slower thread is named as the feeder's pace."""
    stage = stages(read=0.1, device=0.85, collate=0.05)
    stage["feeder_ms"] = {"decode": 17.0, "other": 0.5, "workers": 0.4, "decoded_full": 0.0, "resize": 3.1,
                          "decode_wait": 14.0, "slot_wait": 0.2, "starved": 9.0, "decode_gpu": 16.5,
                          "resize_gpu": 0.8}
    _, reasons, suggestions = judge(0.5, system(cpu_percent=30.0, workers_cpu_cores=2.0, main_cpu_cores=0.6),
                                    stage=stage, loader=DEVICE, cuda=True)
    line = next(r for r in reasons if r.startswith("device feeder per batch"))
    assert "decode thread 17.5 ms busy (waited 0.4 ms for the workers" in line
    assert "resize thread 3.1 ms busy (waited 14.0 ms for a decoded batch, 0.2 ms for a free slot)" in line
    assert "GPU: decode stream 16.5 ms, resize stream 0.8 ms" in line
    assert any("decode thread sets its pace (17.5 ms" in s for s in suggestions)


def test_a_metered_device_path_loop_reports_its_feeder(jpeg_photos):
    loader = fastdata.loader(jpeg_photos[0], batch_size=4, image_size=32, num_workers=0, decode="device",
                             device="cpu")
    metered = fastdata.meter(loader, system=False, warmup_steps=1)
    for _ in metered:
        pass
    report = metered.report()
    loader.close_feeder()
    feeder = report.stages["feeder_ms"]
    assert feeder["resize"] > 0 and feeder["decode"] > 0 and "decode_gpu" in feeder
    assert any(r.startswith("device feeder per batch") for r in report.reasons)


def test_loader_facts_read_the_datasets_progressive_count(photos):
    """What the meter knows of a fastdata loader's dataset: how many progressive JPEGs (and images that are not
    JPEGs) the conversion stored."""
    loader = fastdata.loader(photos[0], batch_size=4, num_workers=0)
    facts = LoaderFacts.of(loader)
    kinds = fastdata.info(photos[0]).stats["gpu_kinds"]
    assert facts.progressive == kinds["progressive"] and facts.not_jpeg == kinds["not_jpeg"] > 0
    assert facts.stored == len(fastdata.dataset(photos[0]))


def test_device_path_workers_busy_decoding_what_is_not_jpeg_are_told_of_non_jpeg_jpeg():
    """The device path's workers saturated by decoding: they decode only what the GPU cannot take, so a dataset
    that stores PNGs is told how to store them as JPEGs; the worker path is not (it decodes everything)."""
    sysf = system(cores=8, cpu_percent=97.0, workers_cpu_cores=7.8, main_cpu_cores=0.2)
    decode_bound = stages(read=0.05, decode=0.7, augment=0.15, collate=0.1)
    _, _, on_device = judge(0.7, sysf, stage=decode_bound, loader=dataclasses.replace(DEVICE, not_jpeg=112),
                            cuda=True)
    assert any("112 images that are not JPEGs" in s and "--non-jpeg jpeg" in s for s in on_device)
    _, _, on_workers = judge(0.7, sysf, stage=decode_bound,
                             loader=dataclasses.replace(WORKER_DECODE, not_jpeg=112), cuda=True)
    assert not any("--non-jpeg" in s for s in on_workers)


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


# -------------------------------------------------------------------------------------------------
# advice that fits the dataset, and no verdict before there is a measured window


@pytest.fixture(scope="module")
def sized(tmp_path_factory, solid_lmdb, solid_wds):
    """fastdata datasets whose largest stored side is known: the solid ones (small images), large PNGs (700 px
    and up) as stored and converted with --max-size 512, and shards whose sizes are not known."""
    from builders import build_large_tree

    root = tmp_path_factory.mktemp("sized")
    tree = build_large_tree(root / "src", count=3)
    large, bounded = root / "large.lmdb", root / "bounded"
    fastdata.convert_imagefolder(tree.root, large, fastdata.ImageFolderOptions(workers=1, progress=False))
    fastdata.convert_imagefolder(
        tree.root, bounded, fastdata.ImageFolderOptions(format="wds", max_size=512, workers=1, progress=False)
    )
    return {"small": solid_lmdb, "large": large, "bounded": bounded, "unknown": solid_wds}


def _decode_bound(path):
    facts = LoaderFacts.of(fastdata.loader(path, batch_size=4, image_size=16, num_workers=0))
    return facts, judge(0.7, system(cpu_percent=97.0, workers_cpu_cores=7.8), loader=facts,
                        stage=stages(read=0.05, decode=0.7, augment=0.15, collate=0.1))


def test_max_size_is_advised_only_for_a_dataset_with_larger_images(sized):
    """Decode-bound over a dataset with no image over 512 px: no `--max-size 512` (it would change nothing);
    over 700-px images it is advised, naming the largest; where the sizes are not known it is said as a
    condition."""
    facts, (_, _, suggestions) = _decode_bound(sized["small"])
    assert facts.largest_side is not None and facts.largest_side <= 512
    assert not any("--max-size" in s for s in suggestions), suggestions
    facts, (_, _, suggestions) = _decode_bound(sized["large"])
    assert facts.largest_side == 702
    assert any(s.startswith("re-convert with `--max-size 512`") and "702 px" in s for s in suggestions)
    facts, (_, _, suggestions) = _decode_bound(sized["bounded"])  # shards, but converted with --max-size 512
    assert facts.largest_side == 512 and not any("--max-size" in s for s in suggestions)
    facts, (_, _, suggestions) = _decode_bound(sized["unknown"])
    assert facts.largest_side is None
    assert any(s.startswith("if the images are larger than 512 px, re-convert with `--max-size 512`")
               for s in suggestions)


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
