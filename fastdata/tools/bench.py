"""`fastdata bench`: loader throughput, and the same measurement of a torchvision ImageFolder DataLoader
(same transform, batch size and DataLoader settings, same stored bytes: `fastdata.tools.bench_baseline`) in the same
run, so the ratio is measured, not guessed; optionally a synthetic upper bound (the same batches served from
memory through the same step), so that the distance to "data loading costs nothing" is measured too. The
fairness rules (settings, warm-up, page cache, alternating repeats, median of per-run ratios) are
`fastdata.tools.bench_fair`'s; `run_contenders` applies them, here and in every script in benchmarks/. Every run
goes through `fastdata.meter` (unless `metered=False`), whose timeline feeds `--plot` and `--json`
(`fastdata.tools.bench_report`), and with `--trace DIR` a Perfetto trace per contender and run (`trace_name`)."""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastdata.errors import ConfigError
from fastdata.formats.manifest import read_manifest
from fastdata.meter.report import BUSY_SHARE, others_share
from fastdata.tools.bench_baseline import (
    Baseline,
    choose_baseline,
    export_baseline,
    imagefolder_baseline,
    list_baseline,
)
from fastdata.tools.bench_fair import (
    STEPS,
    WARMUP_PASSES,
    BenchConfig,
    alternate,
    dataset_files,
    evict_page_cache,
    median_ratio,
    warm_page_cache,
)

__all__ = ["UPPER_BOUND", "BenchConfig", "Contender", "LoaderResult", "RunResult", "baseline_contender",
           "busy_machine_note", "fastdata_contender", "format_summary", "format_table", "imagefolder_baseline",
           "run_bench", "run_contenders", "time_loader"]

UPPER_BOUND = "synthetic upper bound"


@dataclass
class RunResult:
    """One timed run of one loader: the images of its timed passes (after the warm-up passes, if any) over the
    time they took; `first_batch_s` is the time from building the loader to its first batch."""

    name: str
    images: int
    seconds: float
    first_batch_s: float
    bytes_per_image: float
    data_wait_fraction: float | None = None  # from fastdata.meter.loop, after the first batch
    timeline: dict[str, Any] = field(default_factory=dict)  # fastdata.meter's binned throughput and data wait
    system: dict[str, Any] | None = None  # fastdata.meter's sampled system figures
    steps_per_epoch: int | None = None  # batches per timed epoch (a data wait over few batches is mostly start-up)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.images_per_s * self.bytes_per_image / 1e6


@dataclass
class LoaderResult:
    """All runs of one loader, summarised by medians."""

    name: str
    runs: list[RunResult] = field(default_factory=list)
    role: str = "loader"  # "baseline", "loader" or "upper-bound"
    inputs: str = ""  # what it reads, where that needs saying (the baseline's)
    notes: list[str] = field(default_factory=list)  # what a reader must know about its inputs, one line each
    different_inputs: bool = False  # it does not read the bytes fastdata reads

    def ratio_to(self, base: LoaderResult) -> float:
        """Median of the per-run throughput ratios to `base` (run i against base's run i, same round)."""
        return median_ratio([r.images_per_s for r in self.runs], [r.images_per_s for r in base.runs])

    @property
    def images_per_s(self) -> float:
        return statistics.median(r.images_per_s for r in self.runs)

    @property
    def data_wait_fraction(self) -> float | None:
        values = [r.data_wait_fraction for r in self.runs if r.data_wait_fraction is not None]
        return statistics.median(values) if values else None

    @property
    def median_run(self) -> RunResult:
        """The run whose throughput is the median (the lower middle one for an even count)."""
        ordered = sorted(self.runs, key=lambda r: r.images_per_s)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def mb_per_s(self) -> float:
        return statistics.median(r.mb_per_s for r in self.runs)

    @property
    def first_batch_s(self) -> float:
        return statistics.median(r.first_batch_s for r in self.runs)


Step = Callable[[Any, Any], Any]


def time_loader(name: str, make: Callable[[], Iterable], epochs: int, bytes_per_image: float,
                step: str | Step | None = None, warmup_passes: int = WARMUP_PASSES,
                before_timing: Callable[[], Any] | None = None, metered: bool = True,
                trace: Path | None = None) -> RunResult:
    """Build a loader with `make()`, run `warmup_passes` untimed passes over it, then time `epochs` passes,
    doing `step` (a name from STEPS or a function of `(images, labels)`) with every batch of both. Without
    warm-up passes the clock starts before `make()`, so worker start-up is timed. `before_timing` runs
    between the two (e.g. to evict the page cache). `first_batch_s`: from `make()` to the first batch. With
    `metered`, the timed passes go through fastdata.meter (data wait, timeline, system figures), and with `trace`
    its timeline of them is written there (a Chrome / Perfetto trace)."""
    from fastdata.meter.loop import meter

    work, finish = make_step(step)
    started = time.perf_counter()
    loader = make()
    first_batch_s: float | None = None

    def first_batch_seen() -> None:
        nonlocal first_batch_s
        if first_batch_s is None:
            if finish is not None:
                finish()
            first_batch_s = time.perf_counter() - started

    for _ in range(warmup_passes):
        for images, labels in loader:
            if work is not None:
                work(images, labels)
            first_batch_seen()
    if finish is not None:
        finish()
    if before_timing is not None:
        before_timing()
    measure_from = time.perf_counter() if warmup_passes else started
    timed = meter(loader, interval=0.5, trace=trace) if metered else loader
    counted = steps = 0
    for _ in range(epochs):
        for images, labels in timed:
            if work is not None:
                work(images, labels)
            first_batch_seen()
            counted += len(labels)
            steps += 1
    if finish is not None:
        finish()
    seconds = time.perf_counter() - measure_from
    report = timed.report() if metered else None  # type: ignore[attr-defined]  # metered: a Meter
    del loader, timed
    if report is None:
        return RunResult(name, counted, seconds, first_batch_s or 0.0, bytes_per_image)
    return RunResult(name, counted, seconds, first_batch_s or 0.0, bytes_per_image,
                     data_wait_fraction=report.data_wait_fraction, timeline=report.timeline, system=report.system,
                     steps_per_epoch=steps // max(1, epochs))


def make_step(step: str | Step | None) -> tuple[Step | None, Callable[[], None] | None]:
    """(work per batch, what to call before reading the clock) for a step name or function. "to-device"
    copies the batch to the GPU (the CPU without one) and makes float images in [0, 1] there, as the first
    line of a training step does; CUDA is started here so that its start-up is not timed."""
    if step is None or step == "none":
        return None, None
    if callable(step):
        return step, None
    if step != "to-device":
        raise ConfigError(f"step must be one of {STEPS} or a function, got {step!r}")
    import torch

    if torch.cuda.is_available():
        device = torch.device("cuda")
        torch.zeros(1, device=device).add_(1)  # start CUDA now, outside the timing
        finish: Callable[[], None] | None = torch.cuda.synchronize
    else:
        device, finish = torch.device("cpu"), None

    def to_device(images: Any, labels: Any) -> Any:
        labels.to(device, non_blocking=True)
        return images.to(device, non_blocking=True).float().div_(255)

    return to_device, finish


class MemoryBatches:
    """The synthetic upper bound's loader: `per_pass` batches per pass, cycling through batches held in memory,
    so that a pass costs nothing but the step."""

    def __init__(self, batches: list[tuple[Any, Any]], per_pass: int) -> None:
        if not batches:
            raise ConfigError("the synthetic upper bound needs at least one batch, and the loader gave none")
        self.batches, self.per_pass = batches, per_pass

    def __len__(self) -> int:
        return self.per_pass

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for i in range(self.per_pass):
            yield self.batches[i % len(self.batches)]


def collect_batches(loader: Iterable, limit_bytes: int) -> tuple[list[tuple[Any, Any]], int]:
    """Keep the batches of one pass over `loader` (up to `limit_bytes` of them); also returns the batches per
    pass, so that the upper bound runs the same number of steps."""
    kept: list[tuple[Any, Any]] = []
    held = per_pass = 0
    for images, labels in loader:
        per_pass += 1
        size = images.numel() * images.element_size()
        if not kept or held + size <= limit_bytes:
            kept.append((images, labels))
            held += size
    return kept, per_pass


@dataclass
class Contender:
    """One loader of a bench run: its results, how to build it, its bytes per image and the files it reads."""

    result: LoaderResult
    make: Callable[[], Iterable]
    bytes_per_image: float
    files: list[Path]


def run_bench(path: Path, config: BenchConfig, baseline_imagefolder: Path | None = None,
              progress: Callable[[str], None] | None = None, upper_bound: bool = False,
              baseline_source: bool = False, export_dir: Path | None = None,
              baseline_list: Path | None = None, baseline_export: bool = False,
              trace_dir: Path | None = None) -> list[LoaderResult]:
    """Time fastdata.loader over `path` (and the torchvision ImageFolder baseline, and with `upper_bound` the
    same batches from memory), alternating the loaders `config.repeats` times so that machine noise hits all
    alike. Every contender gets the same DataLoader settings, warm-up passes and page-cache treatment, and
    every run does `config.step` with each batch.

    The baseline reads `baseline_imagefolder` (the dataset's source) less the files the conversion rejected; if
    the dataset was re-encoded at conversion, it reads an ImageFolder exported from the dataset instead (into
    `export_dir`, else a temporary directory), unless `baseline_source` asks for the original files (then the
    results say "different inputs"). A dataset converted from a file list takes `baseline_list` (the list) instead:
    its baseline is a torchvision-style Dataset over the images the list names. `baseline_export` (for a source
    that is not files torchvision reads: a Hugging Face dataset, WebDataset shards) makes the baseline a
    torchvision-style Dataset over the dataset's stored bytes exported as files. `trace_dir`: a Perfetto trace
    of every run there (`run_contenders`)."""
    manifest = read_manifest(path)
    say = progress or (lambda _line: None)
    source = _baseline_source(path, manifest.source.get("kind", "imagefolder"), baseline_imagefolder, baseline_list,
                              baseline_export)
    if baseline_export and baseline_source:
        raise ConfigError("--baseline-source applies to --baseline-imagefolder SRC or --baseline-list LIST; "
                          "--baseline-export reads the dataset's stored bytes")
    with ExitStack() as stack:
        contenders: list[Contender] = []
        if source is not None or baseline_export:
            if export_dir is None:
                export_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fastdata-bench-"))) / "export"
            baseline = export_baseline(Path(path), export_dir, say) if source is None else \
                choose_baseline(Path(path), Path(source), baseline_source, export_dir, say)
            contenders.append(baseline_contender(baseline, config))
            for note in baseline.notes():
                say(f"bench: {note}")

        fast = fastdata_contender(path, config)
        contenders.append(fast)
        if upper_bound:
            say(f"bench: holding up to {config.upper_bound_mb} MB of fastdata's batches in memory for the "
                "synthetic upper bound")
            batches, per_pass = collect_batches(fast.make(), config.upper_bound_mb * 10**6)
            contenders.append(Contender(LoaderResult(UPPER_BOUND, role="upper-bound"),
                                        lambda: MemoryBatches(batches, per_pass), fast.bytes_per_image, []))
        return run_contenders(contenders, config, say, f"{manifest.num_samples:,} images", trace_dir=trace_dir)


#: how to ask for the baseline that fits each source kind (any other kind: --baseline-export)
BASELINE_FLAG = {"imagefolder": "--baseline-imagefolder SRC", "list": "--baseline-list LIST"}
EXPORT_FLAG = "--baseline-export (a torchvision Dataset over its stored bytes exported as files)"
SOURCE_NAME = {"imagefolder": "an ImageFolder", "list": "a file list", "hf": "a Hugging Face dataset",
               "webdataset": "WebDataset shards"}


def _baseline_source(path: Path, kind: str, imagefolder: Path | None, file_list: Path | None,
                     export: bool = False) -> Path | None:
    """The baseline's source, given by the flag that fits how the dataset was converted (None: no source, the
    baseline is the export or there is none)."""
    if sum((imagefolder is not None, file_list is not None, export)) > 1:
        raise ConfigError("give the baseline once: --baseline-imagefolder SRC, --baseline-list LIST or "
                          "--baseline-export")
    given = "imagefolder" if imagefolder is not None else "list" if file_list is not None else None
    if given is not None and given != kind:
        fits = BASELINE_FLAG.get(kind, EXPORT_FLAG)
        raise ConfigError(f"{path} was converted from {SOURCE_NAME.get(kind, f'a {kind!r} source')}, not "
                          f"{SOURCE_NAME[given]}: its baseline is {fits}")
    return imagefolder if imagefolder is not None else file_list


def trace_name(name: str, repeat: int) -> str:
    """The trace file of run `repeat` (from 0) of contender `name`: "fastdata (lmdb)" -> "fastdata-lmdb.run1.json"."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "loader"
    return f"{slug}.run{repeat + 1}.json"


def run_contenders(contenders: list[Contender], config: BenchConfig, progress: Callable[[str], None] | None = None,
                   what: str = "the data", trace_dir: Path | None = None) -> list[LoaderResult]:
    """Run every contender `config.repeats` times, alternating, each run `config.warmup_passes` untimed passes
    then `config.epochs` timed ones over a freshly built loader; the files of every contender are read once
    before any timing ("warm") or evicted before each timed run ("cold"). The one loop every bench and
    benchmark script goes through, so that no contender is treated differently. With `trace_dir` (and
    `config.metered`), each run's timed passes are written there as a Perfetto trace (`trace_name`)."""
    say = progress or (lambda _line: None)
    if trace_dir is not None and not config.metered:
        raise ConfigError("a trace comes from fastdata.meter: trace_dir needs BenchConfig(metered=True)")
    if config.page_cache == "warm":
        read = warm_page_cache(f for c in contenders for f in c.files)
        say(f"bench: read every loader's files once before timing ({read / 1e6:,.1f} MB into the page cache)")

    def run(contender: Contender, repeat: int) -> None:
        result = contender.result
        say(f"bench: {result.name}, run {repeat + 1}/{config.repeats} ({config.warmup_passes} untimed + "
            f"{config.epochs} timed passes over {what}, step: {config.step})")
        evict = (lambda: evict_page_cache(contender.files)) if config.page_cache == "cold" else None
        trace = Path(trace_dir) / trace_name(result.name, repeat) if trace_dir is not None else None
        result.runs.append(time_loader(result.name, contender.make, config.epochs, contender.bytes_per_image,
                                       step=config.step, warmup_passes=config.warmup_passes, before_timing=evict,
                                       metered=config.metered, trace=trace))

    alternate(contenders, config.repeats, run)
    return [c.result for c in contenders]


def fastdata_contender(path: Path, config: BenchConfig, name: str | None = None,
                       adjust: Callable[[Any], None] | None = None) -> Contender:
    """fastdata.loader over the dataset at `path` with the bench's settings (`adjust(loader)` may change it
    after it is built, e.g. to compare a variant of the pipeline)."""
    manifest = read_manifest(path)
    settings = config.settings

    def make() -> Iterable:
        from fastdata.loader import loader

        built = loader(path, batch_size=config.batch_size, augment=config.augment, image_size=config.image_size,
                       **settings.loader_kwargs())
        if adjust is not None:
            adjust(built)
        return built

    return Contender(LoaderResult(name or f"fastdata ({manifest.format})"), make,
                     manifest.data_bytes / max(1, manifest.num_samples), dataset_files(path))


def baseline_contender(baseline: Baseline, config: BenchConfig, name: str | None = None) -> Contender:
    """The torchvision baseline over what `baseline` says it reads: an ImageFolder, or for a list dataset a
    Dataset over the listed images."""
    kind = "torchvision ImageFolder" if baseline.samples is None else "torchvision Dataset"
    name = name or kind + (" (original files)" if baseline.different_inputs else "")
    result = LoaderResult(name, role="baseline", inputs=baseline.inputs, notes=baseline.notes(),
                          different_inputs=baseline.different_inputs)
    per_image = sum(f.stat().st_size for f in baseline.files) / max(1, len(baseline.files))
    if baseline.samples is not None:
        make = list_baseline(baseline.samples, config, baseline.num_classes, baseline.label_kind)
    else:
        make = imagefolder_baseline(baseline.root, config, baseline.excluded_paths)
    return Contender(result, make, per_image, baseline.files)


FEW_STEPS = 8  # batches per epoch below which the table warns that its data wait is start-up


def format_table(results: list[LoaderResult], data_wait: bool = False) -> str:
    """The results as a table; the first row is the baseline the ratios (medians of the per-run ratios) are
    taken against. With `data_wait`, a column with the share of the loop's time spent waiting for the next
    batch (fastdata.meter). Inputs that differ from fastdata's are said above the table."""
    base = results[0]
    width = max(28, *(len(r.name) for r in results))
    wait_head = f" {'data wait':>9}" if data_wait else ""
    header = (f"{'loader':<{width}} {'images/s':>10} {'MB/s':>8} {'1st batch s':>12} {'runs':>5}{wait_head} "
              f"{'vs baseline':>18}")
    lines = [f"DIFFERENT INPUTS: {r.name} reads {r.inputs}" for r in results if r.different_inputs]
    lines.append(f"baseline: {base.name}")
    steps = [run.steps_per_epoch for r in results for run in r.runs if run.steps_per_epoch is not None]
    if data_wait and steps and min(steps) < FEW_STEPS:
        lines.append(f"note: epochs of {min(steps)} batch{'es' * (min(steps) != 1)}: the data wait is mostly the "
                     "workers' start at each epoch, not their steady pace; bench more images for a steady figure")
    lines += [header, "-" * len(header)]
    for r in results:
        wait = ""
        if data_wait:
            fraction = r.data_wait_fraction
            wait = f" {'n/a' if fraction is None else f'{fraction:.0%}':>9}"
        lines.append(f"{r.name:<{width}} {r.images_per_s:>10,.0f} {r.mb_per_s:>8,.1f} {r.first_batch_s:>12.2f} "
                     f"{len(r.runs):>5}{wait} {r.ratio_to(base):>17.2f}x")
    return "\n".join(lines)


def busy_machine_note(results: list[LoaderResult]) -> str:
    """The line printed beside the table when other processes took a noticeable share of the machine's CPU
    (`BUSY_SHARE` or more, fastdata.meter's figures) while a run was timed: its figures and ratios then say as much
    about the other work as about the loaders. "" when every timed run had the machine to itself (or was not
    metered)."""
    measured = [(share, run.system["others_cpu_cores"], run.name) for r in results for run in r.runs
                if run.system is not None and (share := others_share(run.system)) is not None]
    share, others, name = max(measured, default=(0.0, 0.0, ""))
    if share < BUSY_SHARE:
        return ""
    return (f"note: the machine was busy: other processes took up to {share:.0%} of its CPU ({others:.1f} cores, "
            f"while {name} was timed), so these figures are lower and less steady than the loaders alone would "
            "give: rerun on a quiet machine for figures to keep")


def format_summary(results: list[LoaderResult]) -> str:
    """One indented line per loader: its ratio to the baseline (median of per-run ratios) and its share of
    the synthetic upper bound; then what the baseline reads."""
    base = next((r for r in results if r.role == "baseline"), None)
    upper = next((r for r in results if r.role == "upper-bound"), None)
    lines = []
    for r in results:
        if r.role == "upper-bound":
            continue
        parts = []
        if base is not None and r is not base:
            parts.append(f"{r.ratio_to(base):.2f}x {base.name}" + (" (different inputs)" if base.different_inputs
                                                                  else ""))
        if upper is not None:
            parts.append(f"{r.ratio_to(upper):.0%} of the synthetic upper bound")
        if parts:
            lines.append(f"  {r.name}: " + ", ".join(parts))
    if upper is not None:
        lines.append(f"  ({UPPER_BOUND}: the same batches from memory through the same step, "
                     f"{upper.images_per_s:,.0f} images/s)")
    if base is not None:
        lines += [f"  {note}" for note in base.notes]
    return "\n".join(lines)
