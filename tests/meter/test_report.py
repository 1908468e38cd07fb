"""fastdata.meter's report (fastdata.meter.report): the diagnosis of each bottleneck from made-up figures, the
device path's stages and advice, what it knows of a fastdata loader's dataset, and advice that fits the dataset.
The timed loops themselves: test_meter.py."""

from __future__ import annotations

import dataclasses

import pytest

import fastdata
from fastdata.meter.report import LoaderFacts, diagnose
from fastdata.meter.stages import STAGES

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


# -------------------------------------------------------------------------------------------------
# advice that fits the dataset, and no verdict before there is a measured window


@pytest.fixture(scope="module")
def sized(tmp_path_factory, solid_lmdb, solid_wds):
    """fastdata datasets whose largest stored side is known: the solid ones (small images), large PNGs (700 px
    and up) as stored and converted with --max-size 512, and shards whose sizes are not known."""
    from builders.images import build_large_tree

    root = tmp_path_factory.mktemp("sized")
    tree = build_large_tree(root / "src", count=3)
    large, bounded = root / "large.lmdb", root / "bounded"
    fastdata.convert_imagefolder(tree.root, large, fastdata.ImageFolderOptions(workers=1, progress=False))
    fastdata.convert_imagefolder(tree.root, bounded,
                                 fastdata.ImageFolderOptions(format="wds", max_size=512, workers=1, progress=False))
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
