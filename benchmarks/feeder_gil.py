"""What the device path's feeder thread costs the training thread beside it: the two share the main process's GIL.

    python -m benchmarks.feeder_gil [--batch-size 256] [--steps 150] [--decode-ms 2] [--repeats 3]

The feeder (fastdata.image.device.feeder) runs in the training process, so its Python (taking a batch, the device
stage's bookkeeping, the host side of the batched resize) competes with the training thread's Python for the GIL.
On a GPU the training thread's host work is launching the step's kernels, a few hundred short PyTorch calls that
each release the GIL; where that host work is near the step's GPU time, whatever the feeder takes from it slows
the loop.

Here, on the CPU, with stand-ins for what the GPU does:
- the training thread: per batch, two forward + backward + SGD steps of a stack of 60 small linear layers on a tiny
  batch (~6 ms of PyTorch calls, each releasing the GIL, as a GPU step's host side);
- the feeder: fastdata's DeviceFeeder, SlotRing and DeviceStage over batches of --batch-size samples, with a
  decoder stand-in that sleeps --decode-ms per batch (a GPU decoder's call releases the GIL) and returns tiny
  images, so that the stage's arithmetic costs next to nothing and what is left is the feeder's own Python.

Cases, alternating over --repeats runs: the training thread alone (no feeder: the baseline, same run), and taking
each batch from a running feeder, with Python's GIL switch interval (5 ms) and with 0.5 ms. Milliseconds per batch
(medians), what the feeder adds to each, and the training thread's own CPU per batch.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from benchmarks import report
from benchmarks.common import arguments
from fastdata.image.batch import EncodedBatch
from fastdata.image.device.feeder import DeviceFeeder, PassKey, strong
from fastdata.image.device.ring import SlotRing
from fastdata.image.device.stage import DeviceStage
from fastdata.tools.bench_fair import alternate

CASES = ("the training thread alone", "beside the feeder, Python's switch interval (5 ms)",
         "beside the feeder, switch interval 0.5 ms")
INTERVALS = {CASES[1]: 0.005, CASES[2]: 0.0005}
STORED = (16, 12)  # each stand-in image's stored (width, height): the stage's arithmetic stays negligible


class SleepingDecoder:
    """A GPU decoder's call, stood in for: it sleeps (releasing the GIL) and returns one tiny image per payload."""

    name, regions, device = "stand-in", False, torch.device("cpu")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.image = torch.zeros(3, STORED[1], STORED[0], dtype=torch.uint8)

    def decode(self, payloads: list, regions: list | None = None) -> list[torch.Tensor]:
        time.sleep(self.seconds)
        return [self.image for _ in payloads]


def encoded_batch(size: int) -> EncodedBatch:
    """A device-path batch of `size` samples as a worker hands it over (100 bytes each; the decoder ignores them)."""
    return EncodedBatch(
        data=torch.zeros(size * 100, dtype=torch.uint8), offsets=torch.arange(0, size * 100 + 1, 100),
        boxes=torch.tensor([[1.0, 1.0, 10.0, 8.0]] * size, dtype=torch.float64),
        flips=torch.zeros(size, dtype=torch.bool), sizes=torch.tensor([STORED] * size),
        labels=torch.zeros(size, dtype=torch.int64), worker_decoded=torch.zeros(size, dtype=torch.bool),
        pixels=torch.zeros((0, 3, 8, 8), dtype=torch.uint8), keys=[f"sample-{i}" for i in range(size)])


class TrainingStandIn:
    """Per batch, two SGD steps of 60 small linear layers on a tiny batch: a few hundred short PyTorch calls."""

    def __init__(self) -> None:
        layers: list[torch.nn.Module] = []
        for _ in range(60):
            layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
        self.model = torch.nn.Sequential(*layers)
        self.optimiser = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.x = torch.randn(8, 32)

    def __call__(self) -> None:
        for _ in range(2):
            loss = self.model(self.x).square().mean()
            self.optimiser.zero_grad(set_to_none=True)
            loss.backward()
            self.optimiser.step()


def run_case(case: str, step: TrainingStandIn, batches: list[EncodedBatch], steps: int, decode_s: float
             ) -> tuple[float, float, float]:
    """(wall ms per batch, the training thread's CPU ms per batch, the feeder's host ms per batch: None alone)."""
    if case == CASES[0]:
        started, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            step()
        return 1000 * (time.perf_counter() - started) / steps, 1000 * (time.thread_time() - cpu) / steps, 0.0
    previous = sys.getswitchinterval()
    sys.setswitchinterval(INTERVALS[case])
    stage = DeviceStage("cpu", 8, "stand-in", decoder=SleepingDecoder(decode_s), regions=False)
    ring = SlotRing(3, lambda: stage.new_output(len(batches[0])), stage.device)
    feeder = DeviceFeeder(stage, ring, strong(lambda _key: iter(batches)), PassKey(0), follow=lambda _key: None)
    try:
        taken = feeder.batches(PassKey(0))
        for _ in range(5):  # the feeder under way
            next(taken)
        before = dict(stage.timings)
        started, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            next(taken)
            step()
        wall, own = time.perf_counter() - started, time.thread_time() - cpu
        made = stage.timings["batches"] - before["batches"]
        host = sum(stage.timings[part] - before[part] for part in ("decode", "resize", "other")) - made * decode_s
        return 1000 * wall / steps, 1000 * own / steps, 1000 * host / made
    finally:
        feeder.close()
        sys.setswitchinterval(previous)


def main() -> None:
    parser = arguments(__doc__, data=False, repeats=3, batch_size=256, steps=150)
    parser.add_argument("--decode-ms", type=float, default=2.0, help="the decoder stand-in's sleep per batch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    step = TrainingStandIn()
    batches = [encoded_batch(args.batch_size) for _ in range(args.steps + 10)]
    for case in CASES:  # untimed: allocations, the stage's first batches
        run_case(case, step, batches, 10, args.decode_ms / 1000)
    measured: dict[str, list[tuple[float, float, float]]] = {case: [] for case in CASES}

    def run(case: str, _repeat: int) -> None:
        measured[case].append(run_case(case, step, batches, args.steps, args.decode_ms / 1000))

    alternate(CASES, args.repeats, run)
    alone = statistics.median(wall for wall, _, _ in measured[CASES[0]])
    rows = []
    for case in CASES:
        walls = [wall for wall, _, _ in measured[case]]
        wall = statistics.median(walls)
        feeder = statistics.median(host for _, _, host in measured[case])
        rows.append([case, f"{wall:.2f}", f"{min(walls):.2f}-{max(walls):.2f}",
                     "" if case == CASES[0] else f"+{wall - alone:.2f}",
                     f"{statistics.median(own for _, own, _ in measured[case]):.2f}",
                     "" if case == CASES[0] else f"{feeder:.2f}"])
    report.table(f"the training thread's ms per batch, alone and taking each batch from the device path's feeder "
                 f"(batches of {args.batch_size}, a decoder stand-in sleeping {args.decode_ms:g} ms per batch; "
                 f"{args.steps} batches per run, {args.repeats} alternating runs, medians)",
                 ["training thread", "ms per batch", "range", "added by the feeder", "its CPU ms per batch",
                  "the feeder's ms per batch (wall, its sleep left out)"],
                 rows, align="lrrrrr")


if __name__ == "__main__":
    main()
