"""`fastdata bench`: loader throughput, and the same measurement of a torchvision ImageFolder DataLoader
(same transform, batch size and workers) in the same run, so the ratio is measured, not guessed; optionally a
synthetic upper bound (the same batches served from memory through the same step), so that the distance
to "data loading costs nothing" is measured too. Every run goes through `fastdata.meter`, whose timeline
feeds `--plot` and `--json` (`fastdata.bench_report`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastdata.config import available_cores
from fastdata.errors import ConfigError
from fastdata.formats.manifest import read_manifest

STEPS = ("none", "to-device")
UPPER_BOUND = "synthetic upper bound"


@dataclass(frozen=True)
class BenchConfig:
    """What to measure: passes, batch shape, transform preset, workers, repetitions."""

    epochs: int = 2
    batch_size: int = 128
    image_size: int = 224
    augment: str = "train"
    workers: int | None = None
    repeats: int = 1
    step: str = "none"  # what the loop does with each batch: nothing, or copy to the device + float/255 there
    upper_bound_mb: int = 512  # memory the synthetic upper bound may hold batches in

    def __post_init__(self) -> None:
        if self.step not in STEPS:
            raise ConfigError(f"step must be one of {STEPS}, got {self.step!r}")

    @property
    def num_workers(self) -> int:
        return min(available_cores(), 16) if self.workers is None else self.workers


@dataclass
class RunResult:
    """One timed run of one loader. Throughput counts every image after the first batch (warm-up excluded)."""

    name: str
    images: int
    seconds: float
    first_batch_s: float
    bytes_per_image: float
    data_wait_fraction: float | None = None  # from fastdata.meter, after the first batch
    timeline: dict[str, Any] = field(default_factory=dict)  # fastdata.meter's binned throughput and data wait
    system: dict[str, Any] | None = None  # fastdata.meter's sampled system figures

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
                step: str | Step | None = None) -> RunResult:
    """Build a loader with `make()` and time `epochs` passes over it, doing `step` (a name from STEPS or a
    function of `(images, labels)`) with every batch. The first batch (and its step) is warm-up, not counted."""
    from fastdata.meter import meter

    work, finish = make_step(step)
    started = time.perf_counter()
    loader = make()
    metered = meter(loader, interval=0.5)
    first_batch_s = None
    counted = 0
    measure_from = started
    for _ in range(epochs):
        for images, labels in metered:
            if work is not None:
                work(images, labels)
            if first_batch_s is None:
                if finish is not None:
                    finish()
                now = time.perf_counter()
                first_batch_s, measure_from = now - started, now
                continue
            counted += len(labels)
    if finish is not None:
        finish()
    seconds = time.perf_counter() - measure_from
    report = metered.report()
    del loader, metered
    return RunResult(name, counted, seconds, first_batch_s or 0.0, bytes_per_image,
                     data_wait_fraction=report.data_wait_fraction, timeline=report.timeline, system=report.system)


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

    def __iter__(self):
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


def imagefolder_baseline(src: Path, config: BenchConfig) -> Callable[[], Iterable]:
    """torchvision ImageFolder + DataLoader with the same transform, batch size and workers."""
    import torch
    from torchvision import datasets
    from torchvision import transforms as T

    size = config.image_size
    if config.augment == "train":
        transform = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])
    else:
        transform = T.Compose([T.Resize(round(size / 0.875)), T.CenterCrop(size), T.PILToTensor()])

    def make() -> Iterable:
        data = datasets.ImageFolder(str(src), transform=transform)
        return torch.utils.data.DataLoader(data, batch_size=config.batch_size, shuffle=True,
                                           num_workers=config.num_workers)

    return make


def _source_bytes_per_image(src: Path) -> float:
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    _, class_to_idx = find_classes(str(src))
    samples = make_dataset(str(src), class_to_idx, extensions=IMG_EXTENSIONS, allow_empty=True)
    return sum(Path(p).stat().st_size for p, _ in samples) / max(1, len(samples))


def run_bench(path: Path, config: BenchConfig, baseline_imagefolder: Path | None = None,
              progress: Callable[[str], None] | None = None, upper_bound: bool = False) -> list[LoaderResult]:
    """Time fastdata.loader over `path` (and the ImageFolder baseline over `baseline_imagefolder`, and with
    `upper_bound` the same batches from memory), alternating the loaders `config.repeats` times so that
    machine noise hits all alike. Every run does `config.step` with each batch."""
    from fastdata.loader import loader

    manifest = read_manifest(path)
    contenders: list[tuple[LoaderResult, Callable[[], Iterable], float]] = []
    if baseline_imagefolder is not None:
        contenders.append((LoaderResult("torchvision ImageFolder", role="baseline"),
                           imagefolder_baseline(baseline_imagefolder, config),
                           _source_bytes_per_image(Path(baseline_imagefolder))))

    def make_fastdata() -> Iterable:
        return loader(path, batch_size=config.batch_size, augment=config.augment, image_size=config.image_size,
                      num_workers=config.num_workers)

    stored_bytes = manifest.data_bytes / max(1, manifest.num_samples)
    contenders.append((LoaderResult(f"fastdata ({manifest.format})"), make_fastdata, stored_bytes))
    if upper_bound:
        if progress:
            progress(f"bench: holding up to {config.upper_bound_mb} MB of fastdata's batches in memory for the "
                     "synthetic upper bound")
        batches, per_pass = collect_batches(make_fastdata(), config.upper_bound_mb * 10**6)
        contenders.append((LoaderResult(UPPER_BOUND, role="upper-bound"),
                           lambda: MemoryBatches(batches, per_pass), stored_bytes))
    for repeat in range(config.repeats):
        for result, make, bytes_per_image in contenders:
            if progress:
                progress(f"bench: {result.name}, run {repeat + 1}/{config.repeats} "
                         f"({config.epochs} epochs of {manifest.num_samples:,} images, step: {config.step})")
            result.runs.append(time_loader(result.name, make, config.epochs, bytes_per_image, step=config.step))
    return [result for result, _, _ in contenders]


def format_table(results: list[LoaderResult], data_wait: bool = False) -> str:
    """The results as a table; the first row is the baseline the ratios are taken against. With `data_wait`,
    a column with the share of the loop's time spent waiting for the next batch (fastdata.meter)."""
    base = results[0].images_per_s
    wait_head = f" {'data wait':>9}" if data_wait else ""
    header = (f"{'loader':<28} {'images/s':>10} {'MB/s':>8} {'1st batch s':>12} {'runs':>5}{wait_head} "
              f"{'vs ' + results[0].name[:14]:>18}")
    lines = [header, "-" * len(header)]
    for r in results:
        ratio = r.images_per_s / base if base > 0 else float("nan")
        wait = ""
        if data_wait:
            fraction = r.data_wait_fraction
            wait = f" {'n/a' if fraction is None else f'{fraction:.0%}':>9}"
        lines.append(f"{r.name:<28} {r.images_per_s:>10,.0f} {r.mb_per_s:>8,.1f} {r.first_batch_s:>12.2f} "
                     f"{len(r.runs):>5}{wait} {ratio:>17.2f}x")
    return "\n".join(lines)


def format_summary(results: list[LoaderResult]) -> str:
    """One indented line per loader: its ratio to the baseline and its share of the synthetic upper bound."""
    base = next((r for r in results if r.role == "baseline"), None)
    upper = next((r for r in results if r.role == "upper-bound"), None)
    lines = []
    for r in results:
        if r.role == "upper-bound":
            continue
        parts = []
        if base is not None and r is not base and base.images_per_s > 0:
            parts.append(f"{r.images_per_s / base.images_per_s:.2f}x {base.name}")
        if upper is not None and upper.images_per_s > 0:
            parts.append(f"{r.images_per_s / upper.images_per_s:.0%} of the synthetic upper bound")
        if parts:
            lines.append(f"  {r.name}: " + ", ".join(parts))
    if upper is not None:
        lines.append(f"  ({UPPER_BOUND}: the same batches from memory through the same step, "
                     f"{upper.images_per_s:,.0f} images/s)")
    return "\n".join(lines)
