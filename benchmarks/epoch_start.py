"""Epoch starts: the worker path's whole-epoch rate over short epochs, the workers going on into the next epoch
(fastdata's default with persistent workers: the sampler's rollover) against the same loader made to stop at each
epoch's end and start the next one cold (rollover turned off on its sampler; the code is otherwise the same).

    python -m benchmarks.epoch_start [--images 1200] [--batch-size 64] [--epochs 4] [--repeats 3] [--step-ms 0]

Each run: one loader, one untimed epoch (workers start), then --epochs timed epochs through a step that touches the
batch and then sleeps --step-ms (a stand-in for a model's step on a GPU, which leaves the host free); the table
gives each contender's images/s over the timed epochs (median of the alternating runs) and the median wait for an
epoch's first batch (from `iter()` to the batch), the cost a cold start pays.
"""

from __future__ import annotations

import statistics
import time

import fastdata
from benchmarks import report
from benchmarks.common import arguments, dataset_for
from fastdata.tools.bench_fair import alternate, per_run_ratios

CONTENDERS = ("rollover (default)", "cold epoch starts")


def run(path, rollover: bool, args) -> tuple[float, float]:
    """(images/s over the timed epochs, median wait for an epoch's first batch in seconds)."""
    loader = fastdata.loader(path, batch_size=args.batch_size, image_size=224, num_workers=args.workers, seed=1)
    if not rollover:
        loader._sampler.can_roll_over = False  # this loader only: each epoch starts its workers' work afresh
    for _ in loader:  # untimed: the workers start
        pass
    images, first_waits = 0, []
    started = time.perf_counter()
    for _ in range(args.epochs):
        asked = time.perf_counter()
        for number, (batch, _labels) in enumerate(loader):
            if number == 0:
                first_waits.append(time.perf_counter() - asked)
            images += len(batch)
            batch[0, 0, 0, 0].item()  # the step: touch the batch, then "train" on it
            if args.step_ms:
                time.sleep(args.step_ms / 1e3)
    seconds = time.perf_counter() - started
    loader.close()
    return images / seconds, statistics.median(first_waits)


def main() -> None:
    args = arguments(__doc__.split("\n")[0], images=1200, epochs=4, batch_size=64, workers=2, step_ms=0.0).parse_args()
    path = dataset_for(args.data, args.images)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in CONTENDERS}
    alternate(CONTENDERS, args.repeats, lambda name, _: results[name].append(run(path, name == CONTENDERS[0], args)))
    rates = {name: [r for r, _ in runs] for name, runs in results.items()}
    rows = []
    for name in CONTENDERS:
        ratios = per_run_ratios(rates[name], rates[CONTENDERS[1]])
        rows.append([name, f"{statistics.median(rates[name]):,.0f}",
                     f"{statistics.median(w for _, w in results[name]) * 1e3:,.0f}",
                     f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"])
    report.table(f"{args.images:,} sample photos, batches of {args.batch_size} (train, 224 px), {args.workers} "
                 f"persistent workers, a step of {args.step_ms:g} ms, {args.epochs} timed epochs per run, medians of "
                 f"{args.repeats} alternating runs",
                 ["loader", "images/s", "first batch of an epoch, ms", "x cold starts (runs)"], rows, align="lrrr")


if __name__ == "__main__":
    main()
