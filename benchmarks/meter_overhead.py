"""What `fastdata.meter` costs per step: a loop over batches already in memory, plain and metered, in the same
run (one untimed pass each, then --repeats alternating runs; the overhead is the median of the per-run
differences), so the difference is the meter's own work per step. Then a loop whose step takes 10 ms (busy
wait, which is steadier than sleep), plain and metered, as a share of the step. Last, what `trace=` adds: the
empty loop metered with a trace, the file written at the end of each pass included.

    python -m benchmarks.meter_overhead --steps 200000 --repeats 5

Targets (issue 6): under 50 us per step, and under 1% of a 10 ms step.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterable

import torch

import fastdata
from benchmarks import report
from benchmarks.common import arguments
from fastdata.tools.bench_fair import alternate


def loop(iterable: Iterable, work: Callable[[], None] | None) -> float:
    """Seconds for one pass over `iterable`, doing `work` per step."""
    started = time.perf_counter()
    if work is None:
        for _batch in iterable:
            pass
    else:
        for _batch in iterable:
            work()
    return time.perf_counter() - started


def busy(seconds: float) -> Callable[[], None]:
    def work() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return work


def measure(batches: list, repeats: int, work: Callable[[], None] | None, **meter_options) -> tuple[float, float]:
    """(median plain seconds per step, that + the median of the per-run overheads), after one untimed pass
    each, runs alternating."""
    times: dict[bool, list[float]] = {False: [], True: []}

    def run(metered: bool, _repeat: int) -> None:
        if not metered:
            times[False].append(loop(batches, work) / len(batches))
            return
        m = fastdata.meter(batches, **meter_options)
        times[True].append(loop(m, work) / len(batches))
        m.report()  # as a user would; not timed

    alternate([False, True], 1, run)  # the warm-up pass of each
    times[False].clear()
    times[True].clear()
    alternate([False, True], repeats, run)
    plain = statistics.median(times[False])
    return plain, plain + statistics.median(m - p for p, m in zip(times[False], times[True], strict=True))


def main() -> None:
    parser = arguments(__doc__, images=None, repeats=5, data=False)
    parser.add_argument("--steps", type=int, default=200_000, help="steps of the empty loop")
    parser.add_argument("--slow-steps", type=int, default=300, help="steps of the 10 ms loop")
    args = parser.parse_args()

    images, labels = torch.zeros(256, 3, 8, 8, dtype=torch.uint8), torch.zeros(256, dtype=torch.int64)
    batches = [(images, labels)] * args.steps
    cases = [("empty step, system sampler on (default)", {}),
             ("empty step, system sampler off", {"system": False}),
             ("empty step, live line every 1,000 steps", {"log_every": 1000, "log": lambda _line: None})]
    rows = []
    worst = 0.0
    for name, options in cases:
        plain, metered = measure(batches, args.repeats, None, **options)
        worst = max(worst, metered - plain)
        rows.append([name, f"{plain * 1e6:.3f}", f"{metered * 1e6:.3f}", f"{(metered - plain) * 1e6:.3f}", ""])

    passes = [loop(fastdata.meter([]), None) for _ in range(max(5, args.repeats))]
    per_pass = statistics.median(passes)
    rows.append(["fixed cost per pass (sampler start + stop)", "", "", f"{per_pass * 1e6:.1f}", ""])
    slow = batches[: args.slow_steps]
    plain, metered = measure(slow, args.repeats, busy(0.010))
    rows.append(["10 ms step (busy wait), sampler on", f"{plain * 1e6:.1f}", f"{metered * 1e6:.1f}",
                 f"{(metered - plain) * 1e6:.1f}", f"{(metered - plain) / plain:+.2%}"])
    notes = [f"worst overhead of the empty loops: {worst * 1e6:.2f} us per step (target < 50 us)",
             f"as a share of a 10 ms step: {worst / 0.010:.4%} from the empty loop; "
             f"{(metered - plain) / plain:+.4%} measured on the 10 ms loop itself, {args.slow_steps} steps per pass, "
             f"the per-pass cost ({per_pass * 1e3:.1f} ms) included (target < 1%)"]
    with tempfile.TemporaryDirectory(prefix="fastdata-trace-") as tmp:
        plain, untraced = measure(batches, args.repeats, None)
        _, traced = measure(batches, args.repeats, None, trace=f"{tmp}/run.json")
    notes.append(f"trace=: {(traced - untraced) * 1e6:.2f} us per step on top of the meter ({args.steps:,} steps a "
                 "pass, two events a step, the file written at the end of each pass included)")
    report.table(f"fastdata.meter overhead: medians of {args.repeats} alternating runs, torch {torch.__version__}, "
                 f"batches of (uint8 [256, 3, 8, 8], int64 [256])",
                 ["loop", "plain us/step", "metered us/step", "overhead us/step",
                  f"overhead, of the loop ({args.slow_steps} steps a pass, the per-pass cost included)"], rows,
                 notes=notes)


if __name__ == "__main__":
    main()
