"""What weighted mixing costs, in the same run:

1. the schedule: seconds to draw one epoch's mixed stream (two sources, `--samples` in all) against the plain
   loader's epoch permutation of as many samples (done once per epoch, in the main process);
2. loading: images/s of `fastdata.loader([a, b], weights=[0.7, 0.3])` against `fastdata.loader` over one LMDB
   dataset holding as many images (the same photos: a is the first 70%, b the rest), augment="train".

    python -m benchmarks.mixing --samples 1300000 --images 3000 --repeats 3

Target: the mixed loader within a few percent of the plain one (the schedule is vectorised numpy; each batch is
read by index exactly as from one dataset).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import fastdata
from benchmarks import report
from benchmarks.common import arguments
from fastdata.order.epoch import epoch_order
from fastdata.order.mixing import MixPlan, mixed_epoch
from fastdata.tools.bench_fair import alternate
from fastdata.tools.sample import make_sample_imagefolder


def schedule_seconds(samples: int, repeats: int) -> tuple[float, float]:
    """(median seconds of the plain epoch order, of the mixed stream) for `samples` samples."""
    plan = MixPlan.make([samples * 9 // 10, samples - samples * 9 // 10], [0.9, 0.1], end="last")
    times: dict[str, list[float]] = {"plain": [], "mixed": []}

    def run(name: str, repeat: int) -> None:
        started = time.perf_counter()
        if name == "plain":
            epoch_order(plan.epoch_length(), 0, repeat, True)
        else:
            mixed_epoch(plan, 0, repeat, True, 256)
        times[name].append(time.perf_counter() - started)

    plan.epoch_length()  # the plan's stream is computed once per loader, not per epoch
    alternate(["plain", "mixed"], repeats, run)
    return statistics.median(times["plain"]), statistics.median(times["mixed"])


def split_tree(source: Path, out: Path, share: float) -> tuple[Path, Path]:
    """Two ImageFolder trees: the first `share` of every class's files, and the rest."""
    a, b = out / "a", out / "b"
    for class_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        files = sorted(class_dir.iterdir())
        cut = round(len(files) * share)
        for tree, part in ((a, files[:cut]), (b, files[cut:])):
            (tree / class_dir.name).mkdir(parents=True, exist_ok=True)
            for f in part:
                shutil.copy(f, tree / class_dir.name / f.name)
    return a, b


def loading(images: int, repeats: int, workers: int, batch_size: int) -> tuple[float, float]:
    """(median images/s of the plain loader, of the mixed one)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tree = make_sample_imagefolder(root / "src", images=images, classes=10, seed=0)
        a_tree, b_tree = split_tree(tree, root, 0.7)
        whole, a, b = root / "whole.lmdb", root / "a.lmdb", root / "b.lmdb"
        for src, out in ((tree, whole), (a_tree, a), (b_tree, b)):
            fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(progress=False))
        options = dict(batch_size=batch_size, num_workers=workers, image_size=160, seed=0)
        loaders = {"plain": fastdata.loader(whole, **options),
                   "mixed": fastdata.loader([a, b], weights=[0.7, 0.3], mixing=fastdata.MixOptions(epoch_end="last"),
                                             **options)}
        rates: dict[str, list[float]] = {"plain": [], "mixed": []}
        for loader in loaders.values():  # one untimed pass each
            sum(1 for _ in loader)

        def run(name: str, _repeat: int) -> None:
            started = time.perf_counter()
            count = sum(len(labels) for _images, labels in loaders[name])
            rates[name].append(count / (time.perf_counter() - started))

        alternate(list(loaders), repeats, run)
        return statistics.median(rates["plain"]), statistics.median(rates["mixed"])


def main() -> None:
    parser = arguments(__doc__, images=3000, repeats=3, data=False, workers=2, batch_size=64)
    parser.add_argument("--samples", type=int, default=1_300_000, help="samples in the schedule's epoch")
    args = parser.parse_args()
    plain, mixed = schedule_seconds(args.samples, args.repeats)
    report.table(f"one epoch's schedule: medians of {args.repeats} alternating runs",
                 [f"schedule of {args.samples} samples", "seconds per epoch", "ratio to plain"],
                 [["plain epoch_order", f"{plain:.3f}", "1.00"],
                  ["mixed stream (0.9 / 0.1, epoch_end='last')", f"{mixed:.3f}", f"{mixed / plain:.2f}"]])
    plain_rate, mixed_rate = loading(args.images, args.repeats, args.workers, args.batch_size)
    report.table(f"loading, augment='train', image size 160, batch {args.batch_size}: one untimed pass each, "
                 f"medians of {args.repeats} alternating runs",
                 [f"loading {args.images} images, {args.workers} workers", "images/s", "ratio to plain"],
                 [["fastdata.loader(one.lmdb)", f"{plain_rate:.0f}", "1.00"],
                  ["fastdata.loader([a, b], weights=[0.7, 0.3])", f"{mixed_rate:.0f}",
                   f"{mixed_rate / plain_rate:.2f}"]])


if __name__ == "__main__":
    main()
