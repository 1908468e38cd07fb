"""Every benchmark, grouped by the question it answers (its suite): the arguments of its full run (the run whose
figures the READMEs give), of its smoke run (a tiny size that proves it runs; its figures mean nothing), what it
needs (an extra module, a GPU) and how long its full run may take.

`python -m benchmarks list` prints this table; `python -m benchmarks run SUITE` runs a suite's benchmarks one after
another, each in a fresh Python process.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The device suite's time, set-up included (`device_setup.SETUP_TIMEOUT` + its benchmarks' caps): one device
#: call may run 600 s; this leaves room to start the machine and rerun a part.
DEVICE_SUITE_S = 540

#: suite -> the question its benchmarks answer
SUITES = {
    "read": "How fast does a training loop get its batches on the CPU, against torchvision, FFCV, DALI, HF "
            "datasets, webdataset and its own other paths?",
    "convert": "How fast is a conversion against the least a converter must do, FFCV's writer and Ray?",
    "text": "How fast are text conversion and packed-token loading against the tokenizer, nanoGPT's get_batch and "
            "HF datasets, and what do document boundaries, best-fit packing and cutting one big file cost or gain?",
    "device": "Does the GPU ever wait? Decode on the GPU's engines and the training feed of real models, in "
              "steady state (a GPU machine: one command whose time caps, set-up included, add up to "
              f"{DEVICE_SUITE_S} s).",
    "memory": "What do the loader's workers and main process hold in memory?",
    "startup": "How long from a command or `import fastdata` to the first batch, at 10k to 10M samples?",
}


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: the module of benchmarks/ it runs (`python -m benchmarks.NAME`; `module` names another
    than NAME; or `command`: Python arguments, for a run that is not a module of ours, such as the cuda-marked
    tests), run with `args` (full) or `smoke`; `--repeats N` is passed on when it `takes_repeats`. `needs`: modules
    it cannot run without ("cuda": a CUDA GPU); missing, the benchmark is left out with the reason, except that a
    smoke run without a GPU runs `cpu_smoke` instead where it is given (the parts of a GPU benchmark the CPU can
    run: proof that the module works). `timeout`: seconds the full run may take before the harness stops it.
    `writes_json`: the module takes `--json FILE` and writes its own results there as it goes; the harness passes
    one beside its own results file."""

    name: str
    suite: str
    about: str
    args: tuple[str, ...] = ()
    smoke: tuple[str, ...] = ()
    takes_repeats: bool = True
    needs: tuple[str, ...] = ()
    timeout: float = 3600.0
    command: tuple[str, ...] = ()
    module: str = ""
    cpu_smoke: tuple[str, ...] | None = None
    writes_json: bool = False

    @property
    def runner(self) -> str:
        """The module that runs it, `benchmarks.NAME` ("" for a `command`)."""
        return "" if self.command else f"benchmarks.{self.module or self.name}"

    @property
    def target(self) -> tuple[str, ...]:
        """The Python arguments that run it: `-m benchmarks.NAME`, or its `command`."""
        return self.command or ("-m", self.runner)

    def smoke_args(self, cuda: bool) -> tuple[str, ...]:
        """The arguments of its smoke run on a machine with (`cuda`) or without a CUDA GPU: its CPU smoke where it
        needs a GPU this machine lacks and has one."""
        return self.cpu_smoke if self.runs_on_cpu(cuda) and self.cpu_smoke is not None else self.smoke

    def runs_on_cpu(self, cuda: bool) -> bool:
        """Whether its smoke run on a machine without (`cuda` False) a GPU is its CPU smoke."""
        return self.cpu_smoke is not None and "cuda" in self.needs and not cuda


_SMOKE_IMAGES = ("--images", "60", "--repeats", "1")

BENCHMARKS: tuple[Benchmark, ...] = (
    # read: the loader on the CPU
    Benchmark("cpu_path", "read", "ImageFolder + PIL, torchvision.io + v2, fastdata, FFCV, DALI CPU, the decode "
              "ceiling: train, val, --max-size 256", ("--images", "4000"), ("--images", "60", "--repeats", "1",
                                                                             "--no-peers")),
    Benchmark("bench_sample", "read", "what `fastdata bench` prints on the demo's sample photos (kept as printed: "
              "the documents' sample of its output)", ("--images", "1200"), ("--images", "60", "--repeats", "1")),
    Benchmark("imagefolder_vs_fastdata", "read", "torchvision ImageFolder vs fastdata LMDB / WebDataset",
              ("--images", "3000"), _SMOKE_IMAGES),
    Benchmark("source_kinds", "read", "a file list and an HF dataset: torchvision / HF set_transform vs fastdata",
              ("--images", "3000"), _SMOKE_IMAGES, needs=("datasets",)),
    Benchmark("detection", "read", "COCO detection: CocoDetection + transforms.v2 vs fastdata (boxes)",
              ("--images", "3000"), _SMOKE_IMAGES, needs=("pycocotools",)),
    Benchmark("detection_masks", "read", "COCO detection with instance masks: CocoDetection + v2 vs fastdata",
              ("--images", "3000", "--masks"), (*_SMOKE_IMAGES, "--masks"), needs=("pycocotools",),
              module="detection"),
    Benchmark("pairs", "read", "image-text pairs: a webdataset pipeline vs fastdata", ("--images", "3000"),
              _SMOKE_IMAGES),
    Benchmark("mixing", "read", "weighted mixing: the mixed schedule vs a plain permutation; mixed loading",
              ("--samples", "1300000", "--images", "3000"), ("--samples", "20000", "--images", "60",
                                                             "--repeats", "1")),
    Benchmark("remote_vs_local", "read", "fastdata over HTTP (no cache, cold, warm) vs local disk",
              ("--images", "1000"), _SMOKE_IMAGES),
    Benchmark("region_decode", "read", "one core: region decode vs whole-image decode (on cpu_path's dataset: "
              "after it)", (), ("--data", "benchmarks/data/cpu-path-60.lmdb", "--repeats", "1")),
    Benchmark("restart_decode", "read", "one core: a crop from a restart-indexed JPEG vs region decode",
              ("--images", "2000", "--repeats", "5"), _SMOKE_IMAGES),
    Benchmark("float_output", "read", "one core: uint8 batches vs normalised float32 / bfloat16 / float16",
              ("--images", "3000"), _SMOKE_IMAGES),
    Benchmark("device_cpu_side", "read", "one worker core: decode='worker' vs the CPU side of 'device'",
              ("--images", "3000"), (*_SMOKE_IMAGES, "--batch-size", "16")),
    Benchmark("resize_kernel", "read", "the device path's batched crop-resize-flip (device='cpu' here, CUDA in "
              "gpu_check): matrix products vs per-tap gathers", ("--batch-size", "64", "--batches", "3"),
              ("--images", "60", "--batch-size", "16", "--batches", "2", "--repeats", "1")),
    Benchmark("device_handover", "read", "the main process taking a device-path batch from a worker: one shared "
              "piece vs a shared tensor per field, the worker waiting or busy", ("--images", "3000"),
              ("--images", "60", "--batch-size", "16", "--batches", "3", "--repeats", "1")),
    Benchmark("feeder_gil", "read", "the training thread's time per batch alone and beside the device path's "
              "feeder thread (they share the GIL), Python's switch interval and 0.5 ms", (),
              ("--steps", "10", "--batch-size", "16", "--repeats", "1")),
    Benchmark("autotune", "read", "fastdata tune (its time, its choice) vs the full grid of workers x prefetch",
              ("--images", "3000", "--step", "none", "--budget", "60"),
              ("--images", "60", "--budget", "5", "--window", "0.5", "--confirm", "1", "--max-workers", "1")),
    Benchmark("meter_overhead", "read", "a training loop plain vs metered", (),
              ("--steps", "2000", "--slow-steps", "10", "--repeats", "1")),
    Benchmark("epoch_start", "read", "short epochs: the workers going on into the next epoch vs cold epoch starts",
              ("--images", "1200", "--batch-size", "128", "--step-ms", "100"),
              ("--images", "60", "--repeats", "1", "--epochs", "2", "--batch-size", "8")),
    Benchmark("recipes", "read", "recipes (RandomResizedCrop + flip + TrivialAugmentWide / RandAugment(2, 9) + "
              "RandomErasing, MixUp / CutMix): torchvision ImageFolder + v2 vs fastdata with that v2 transform vs "
              "fastdata's recipe presets vs the crop preset alone", ("--images", "3000", "--repeats", "5"),
              _SMOKE_IMAGES),
    Benchmark("recipe_agreement", "read", "the recipe presets' operations vs torchvision's at every magnitude bin: "
              "mean / max grey-level difference (deterministic)", ("--images", "16"),
              ("--images", "2", "--bins", "0", "30", "--repeats", "1"), takes_repeats=False),
    Benchmark("hardening", "read", "clean vs 2% corrupt records: the cost of counting and reporting them",
              ("--images", "3000"), _SMOKE_IMAGES),
    # convert
    Benchmark("convert_speed", "convert", "conversion vs a bare verification pool, FFCV's writer, a raw LMDB copy, "
              "--engine ray; the parent's CPU per image", ("--images", "3000", "--skip-text"),
              ("--images", "60", "--small", "12", "--repeats", "1", "--skip-text", "--skip-peers")),
    Benchmark("baseline_layout", "convert", "--jpeg-layout baseline vs the original layout: conversion time, the "
              "rewrite per progressive file, bytes", ("--images", "3000"), _SMOKE_IMAGES),
    Benchmark("ray_convert", "convert", "--engine ray vs the local pool, on a running local Ray cluster",
              ("--images", "12000"), ("--images", "60", "--small", "12", "--repeats", "1"), needs=("ray",)),
    # text
    Benchmark("text_throughput", "text", "text conversion vs encode_batch_fast; packed loading vs memmap "
              "slicing, nanoGPT get_batch, memmap DataLoaders, HF datasets", ("--mb", "80"),
              ("--mb", "2", "--repeats", "1")),
    Benchmark("text_convert", "text", "text conversion with default settings vs a tokenize script and HF "
              "datasets map", ("--mb", "80"), ("--mb", "2", "--repeats", "1")),
    Benchmark("text_packing", "text", "boundaries=True and best-fit loading vs plain packed blocks; best-fit "
              "padding and cut documents vs next-fit; planning 10M documents", ("--mb", "80"),
              ("--mb", "2", "--repeats", "1", "--epochs", "1", "--seq-len", "256", "--synthetic-documents",
               "20000", "--plan-documents", "100000")),
    Benchmark("text_one_file", "text", "one big .txt converted with --workers 2: cut and tokenized on every "
              "worker vs kept whole", ("--mb", "80"), ("--mb", "2", "--repeats", "1")),
    # device (a GPU machine): caps + device_setup.SETUP_TIMEOUT = DEVICE_SUITE_S (tests/test_benchmark_tables.py)
    Benchmark("cuda_tests", "device", "the cuda-marked tests (delayed-stream label and batch checks included)",
              takes_repeats=False, needs=("cuda",), timeout=110,
              command=("-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests/image")),
    Benchmark("gpu_check", "device", "each decoder and nvImageCodec backend mix, decode only; the engines alone "
              "over baseline JPEGs, one decoder or two; the resize kernel's GPU time (CUDA events, target 1 ms)",
              ("--images", "6144", "--repeats", "2", "--out", "/tmp/gpu-data"),
              ("--images", "256", "--repeats", "1", "--out", "/tmp/gpu-data"), needs=("cuda",), timeout=110,
              cpu_smoke=("--images", "60", "--repeats", "1", "--device", "cpu", "--out", "/tmp/gpu-data-smoke"),
              writes_json=True),
    Benchmark("gpu_train_feed", "device", "ResNet-18 / ResNet-50 fed by ImageFolder, decode='worker', the device "
              "path and the defaults, in steady state (96-batch epochs, warm-up epoch, CUDA events per step), with "
              "the ceiling, loader-alone and decode-only rows",
              ("--images", "6144", "--copies", "4", "--repeats", "1", "--budget-s", "235", "--out",
               "/tmp/gpu-data"),
              ("--images", "512", "--copies", "2", "--repeats", "1", "--models", "resnet18", "--out",
               "/tmp/gpu-data"), needs=("cuda",), timeout=260,
              cpu_smoke=("--images", "60", "--copies", "2", "--models", "resnet18", "--workers", "1", "--device",
                         "cpu", "--image-size", "32", "--batch-size", "8", "--out", "/tmp/gpu-data-smoke"),
              writes_json=True),
    # memory
    Benchmark("idle_workers", "memory", "memory the idle persistent workers of a val loader hold",
              ("--images", "3000", "--workers", "4"), _SMOKE_IMAGES),
    Benchmark("rss_split", "memory", "the main process's and the workers' RSS over an epoch",
              ("--images", "4000"), ("--images", "60", "--repeats", "1", "--epochs", "1")),
    # startup
    Benchmark("command_startup", "startup", "fastdata --version / --help / import / a small convert vs python -c "
              "pass", (), ("--repeats", "2"), module="startup"),  # not named as its suite
    Benchmark("startup_scale", "startup", "import fastdata to the first batch, and the main process's peak RSS, "
              "at 10k to 10M samples", ("--repeats", "3"), ("--sizes", "10k", "--text-sizes", "10k", "--repeats",
                                                           "1")),
)

assert not {b.name for b in BENCHMARKS} & set(SUITES), "a benchmark named as a suite could never be run alone"


def of_module(module: str) -> Benchmark:
    """The benchmark that `python -m module` runs (`benchmarks.NAME`): the one named as its module where two run
    it (detection: detection and detection_masks)."""
    found = [b for b in BENCHMARKS if b.runner == module]
    if not found:
        raise SystemExit(f"{module} is not a registered benchmark (benchmarks/registry.py)")
    return next((b for b in found if b.runner == f"benchmarks.{b.name}"), found[0])


def select(name: str) -> list[Benchmark]:
    """The benchmarks of suite `name`, or the one benchmark called `name`."""
    chosen = [b for b in BENCHMARKS if b.suite == name] or [b for b in BENCHMARKS if b.name == name]
    if not chosen:
        raise SystemExit(f"no suite or benchmark {name!r}: suites are {', '.join(SUITES)}; "
                         "`python -m benchmarks list` lists the benchmarks")
    return chosen
