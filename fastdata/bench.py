"""`fastdata bench`: loader throughput, and the same measurement of a torchvision ImageFolder DataLoader
(same transform, batch size and workers) in the same run, so the ratio is measured, not guessed."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fastdata.config import available_cores
from fastdata.formats.manifest import read_manifest


@dataclass(frozen=True)
class BenchConfig:
    """What to measure: passes, batch shape, transform preset, workers, repetitions."""

    epochs: int = 2
    batch_size: int = 128
    image_size: int = 224
    augment: str = "train"
    workers: int | None = None
    repeats: int = 1

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

    @property
    def images_per_s(self) -> float:
        return statistics.median(r.images_per_s for r in self.runs)

    @property
    def mb_per_s(self) -> float:
        return statistics.median(r.mb_per_s for r in self.runs)

    @property
    def first_batch_s(self) -> float:
        return statistics.median(r.first_batch_s for r in self.runs)


def time_loader(name: str, make: Callable[[], Iterable], epochs: int, bytes_per_image: float) -> RunResult:
    """Build a loader with `make()` and time `epochs` passes over it."""
    started = time.perf_counter()
    loader = make()
    first_batch_s = None
    counted = 0
    measure_from = started
    for _ in range(epochs):
        for _images, labels in loader:
            if first_batch_s is None:
                now = time.perf_counter()
                first_batch_s, measure_from = now - started, now
                continue
            counted += len(labels)
    seconds = time.perf_counter() - measure_from
    del loader
    return RunResult(name, counted, seconds, first_batch_s or 0.0, bytes_per_image)


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
              progress: Callable[[str], None] | None = None) -> list[LoaderResult]:
    """Time fastdata.loader over `path` (and the ImageFolder baseline over `baseline_imagefolder`),
    alternating the loaders `config.repeats` times so that machine noise hits both alike."""
    from fastdata.loader import loader

    manifest = read_manifest(path)
    contenders: list[tuple[LoaderResult, Callable[[], Iterable], float]] = []
    if baseline_imagefolder is not None:
        contenders.append((LoaderResult("torchvision ImageFolder"), imagefolder_baseline(baseline_imagefolder, config),
                           _source_bytes_per_image(Path(baseline_imagefolder))))

    def make_fastdata() -> Iterable:
        return loader(path, batch_size=config.batch_size, augment=config.augment, image_size=config.image_size,
                      num_workers=config.num_workers)

    contenders.append((LoaderResult(f"fastdata ({manifest.format})"), make_fastdata,
                       manifest.data_bytes / max(1, manifest.num_samples)))
    for repeat in range(config.repeats):
        for result, make, bytes_per_image in contenders:
            if progress:
                progress(f"bench: {result.name}, run {repeat + 1}/{config.repeats} "
                         f"({config.epochs} epochs of {manifest.num_samples:,} images)")
            result.runs.append(time_loader(result.name, make, config.epochs, bytes_per_image))
    return [result for result, _, _ in contenders]


def format_table(results: list[LoaderResult]) -> str:
    """The results as a table; the first row is the baseline the ratios are taken against."""
    base = results[0].images_per_s
    header = (f"{'loader':<28} {'images/s':>10} {'MB/s':>8} {'1st batch s':>12} {'runs':>5} "
              f"{'vs ' + results[0].name[:14]:>18}")
    lines = [header, "-" * len(header)]
    for r in results:
        ratio = r.images_per_s / base if base > 0 else float("nan")
        lines.append(f"{r.name:<28} {r.images_per_s:>10,.0f} {r.mb_per_s:>8,.1f} {r.first_batch_s:>12.2f} "
                     f"{len(r.runs):>5} {ratio:>17.2f}x")
    return "\n".join(lines)
