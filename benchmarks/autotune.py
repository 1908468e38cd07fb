"""`fastdata tune` against the full grid it searches, on the benchmarks' sample converted to LMDB.

    python -m benchmarks.autotune --images 3000 --batch-size 256 --step none --budget 60

The grid measures every point (workers 1..--max-workers, default one more than the usable cores, at most 16;
prefetch 2, 4, 8; decode "worker") the way the tuner measures one (fastdata.tools.tune.measure_point: a loader
with persistent workers, one batch per worker plus one untimed, then --window seconds through the step, timed by
fastdata.meter), --repeats times, alternating, figures being medians. Then `fastdata tune` runs with --budget
(its result kept in a temporary directory, not beside the sample). Last, the tuner's choice and the grid's best
point run --confirm more times, alternating, and their ratio is the median of the per-round ratios.

Targets (issue 20): the tuner's time <= 60 s on a 2-core machine, its choice >= 0.90 of the grid's best.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import fastdata
from benchmarks import report
from benchmarks.common import arguments, dataset_for
from fastdata.config import available_cores
from fastdata.tools.bench_fair import alternate, median_ratio
from fastdata.tools.tune import PREFETCH, Point, Search, TuneConfig, measure_point, run_tune
from fastdata.tools.tune_steps import parse_step


def grid(out: Path, config: TuneConfig, points: list[Point], repeats: int) -> dict[Point, list[float]]:
    """images/s of every point, `repeats` runs each, alternating."""
    step = parse_step(config.step)
    runs: dict[Point, list[float]] = {p: [] for p in points}

    def run(point: Point, repeat: int) -> None:
        measured = measure_point(out, point, config, step)
        runs[point].append(measured.images_per_s)
        print(f"  grid {repeat + 1}/{repeats}: workers={point.num_workers} prefetch={point.prefetch_factor}: "
              f"{measured.images_per_s:,.0f} images/s, data wait {measured.data_wait:.0%}", flush=True)

    alternate(points, repeats, run)
    return runs


def grid_rows(runs: dict[Point, list[float]], chosen: Point) -> list[list[str]]:
    """The grid's table: every point's median images/s, its share of the best point's, its runs, and marks."""
    best = max(runs, key=lambda p: statistics.median(runs[p]))
    top = statistics.median(runs[best])
    rows = []
    for point, values in runs.items():
        rate = statistics.median(values)
        mark = ", ".join(([] if point != best else ["grid best"]) + ([] if point != chosen else ["tuner's choice"]))
        rows.append([str(point.num_workers), str(point.prefetch_factor), f"{rate:,.0f}", f"{rate / top:.0%}",
                     str(len(values)), mark])
    return rows


def search_rows(found: Search) -> list[list[str]]:
    """The tuner's table (as `fastdata.tools.tune.format_search`): the points it measured, in order."""
    points = found.points()
    top = max(m.images_per_s for m in points)
    return [[str(m.point.num_workers), str(m.point.prefetch_factor), m.point.decode, f"{m.images_per_s:,.0f}",
             "n/a" if m.data_wait is None else f"{m.data_wait:.0%}", f"{m.images_per_s / top if top else 0:.0%}",
             str(m.runs), "choice" if m.point == found.choice.point else ""] for m in points]


def main() -> None:
    parser = arguments(__doc__, images=3000, repeats=1, batch_size=256)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--step", default="none", help="as fastdata tune --step (none, to-device, 50ms, resnet18)")
    parser.add_argument("--budget", type=float, default=60.0, help="the tuner's budget, seconds")
    parser.add_argument("--window", type=float, default=3.0, help="measured seconds per point (grid and tuner)")
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument("--confirm", type=int, default=3, help="alternating runs of the choice and the grid best")
    args = parser.parse_args()

    out = dataset_for(args.data, args.images)
    config = TuneConfig(batch_size=args.batch_size, image_size=args.image_size, step=args.step,
                        budget_s=args.budget, window_s=args.window, max_workers=args.max_workers)
    cap = config.workers_cap()
    info = fastdata.info(out)
    print(f"{out}: {info.num_samples:,} images, {info.data_bytes / 2**20:,.1f} MB; {available_cores()} usable cores; "
          f"batch {args.batch_size}, step {args.step}, window {args.window:g} s per point")

    points = [Point(w, p) for w in range(1, cap + 1) for p in PREFETCH]
    print(f"\nfull grid: {len(points)} points x {args.repeats} run(s)")
    started = time.perf_counter()
    runs = grid(out, config, points, args.repeats)
    grid_s = time.perf_counter() - started

    print(f"\nfastdata tune (budget {args.budget:g} s)")
    with tempfile.TemporaryDirectory(prefix="fastdata-autotune-") as tune_dir:
        started = time.perf_counter()
        result = run_tune(out, config, tune_dir=tune_dir, progress=lambda line: print(f"  {line}", flush=True))
        tune_s = time.perf_counter() - started
    chosen = result.search.choice.point
    best = max(runs, key=lambda p: statistics.median(runs[p]))

    ratio = statistics.median(runs[chosen]) / statistics.median(runs[best])
    confirmed = None
    if chosen != best and args.confirm:
        print(f"\nconfirm: the choice and the grid best, {args.confirm} alternating runs each")
        again = grid(out, config, [best, chosen], args.confirm)
        confirmed = median_ratio(again[chosen], again[best])

    report.table(f"full grid ({len(points)} points, {grid_s:.0f} s): medians of {args.repeats} run(s) a point, "
                 f"alternating, {args.window:g} s through step {args.step} each",
                 ["workers", "prefetch", "images/s", "of best", "runs", "mark"], grid_rows(runs, chosen),
                 align="rrrrrl")
    report.table(f"fastdata tune ({len(result.search.points())} points, {len(result.search.measured)} runs, "
                 f"{tune_s:.0f} s)", ["workers", "prefetch", "decode", "images/s", "data wait", "of best", "runs",
                                      "mark"], search_rows(result.search), align="rrrrrrrl",
                 notes=result.search.notes)
    summary = [["tuner's time", f"{tune_s:.1f} s", f"<= 60 s on 2 cores; budget {args.budget:g} s"],
               ["tuner's choice", f"workers={chosen.num_workers} prefetch={chosen.prefetch_factor}", ""],
               ["grid best", f"workers={best.num_workers} prefetch={best.prefetch_factor}", ""],
               ["choice / grid best, grid figures", f"{ratio:.2f}", ">= 0.90"]]
    if confirmed is not None:
        summary.append([f"choice / grid best, {args.confirm} confirming rounds (median of per-round ratios)",
                        f"{confirmed:.2f}", ""])
    summary.append(["grid's time", f"{grid_s:.0f} s for {len(points)} points", ""])
    report.table("summary: fastdata tune against the full grid", ["figure", "value", "target"], summary,
                 align="lll", notes=["the tuner chose the grid's best point"] if chosen == best else [])


if __name__ == "__main__":
    main()
