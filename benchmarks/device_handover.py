"""What taking one worker batch costs the main process on the device path: a batch in one shared-memory piece (the
bytes and the worker's pixels in one storage, the small arrays by value: `EncodedBatch.__reduce__`) against a
shared-memory tensor per field (how a batch crossed before: eight file-descriptor handshakes with the worker).

    python -m benchmarks.device_handover [--images 3000] [--batch-size 256] [--batches 8] [--repeats 5]

The main process's thread that takes the workers' batches is the one that feeds the GPU, and it shares the GIL
with the training step, so each millisecond it spends there is one the GPU may wait. A forked worker process puts
`--batches` device-path batches (`pack_encoded` over the sample photos, fresh tensors for each, as a worker makes
them) on a torch multiprocessing queue, the way DataLoader's workers do, and then either waits or keeps busy in
Python, as a worker making its next batch may (each handshake then waits for the worker's GIL: the worst case); the
main process takes the batches, timing each `get` from the moment the batch is in the pipe (wall, and its thread's
CPU). Busy, with Python's GIL switch interval and with the one fastdata's workers set (`worker_hands_over_quickly`).
The six cases alternate over `--repeats` runs; medians per batch and the ratios (median of per-run ratios)
against the tensor-per-field form in the same case. A second table: a real device-path loader's 2 workers alone,
each batch in a reused shared-memory slot (fastdata.image.buffers) against a fresh segment each.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch
import torch.multiprocessing as mp

import fastdata
from benchmarks import report
from benchmarks.common import arguments, dataset_for
from fastdata.image.batch import EncodedBatch
from fastdata.image.device.ship import encoded_buffer, pack_encoded
from fastdata.processes import stop_processes
from fastdata.tools.bench_fair import alternate, median_ratio
from fastdata.workers import WORKER_SWITCH_INTERVAL, worker_hands_over_quickly

FORMS = ("one piece (today)", "a tensor per field (before)")
STATES = ("waiting", "busy in Python, Python's switch interval (5 ms)",
          f"busy in Python, fastdata's workers' switch interval ({WORKER_SWITCH_INTERVAL * 1000:g} ms)")


def fresh(batch: EncodedBatch, form: str) -> object:
    """A copy of `batch` in new storage, as a worker makes each batch: the EncodedBatch itself (one piece, made in
    shared memory as `pack_encoded` makes it in a worker), or its fields as a dict in private memory (what the
    dataclass pickled before it had `__reduce__`: every tensor on its own, copied into shared memory as it is
    pickled)."""
    if form == FORMS[0]:
        data, pixels, _ = encoded_buffer([batch.data.numpy()], batch.pixels)
        data.share_memory_()  # the storage under both: in shared memory, as a worker makes it
        return replace(batch, data=data, pixels=pixels, offsets=batch.offsets.clone(), boxes=batch.boxes.clone(),
                       flips=batch.flips.clone(), sizes=batch.sizes.clone(), labels=batch.labels.clone(),
                       worker_decoded=batch.worker_decoded.clone())
    return {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in vars(batch).items()}


def worker(batches: list[EncodedBatch], form: str, state: str, queue: mp.Queue, ready: mp.Event,
           done: mp.Event) -> None:
    torch.set_num_threads(1)  # as DataLoader's workers (a forked OpenMP pool would hang)
    busy = state != STATES[0]
    if state == STATES[2]:
        worker_hands_over_quickly()
    made = [fresh(batch, form) for batch in batches]
    ready.set()
    for item in made:
        queue.put(item)
    queue.put(None)
    while busy and not done.is_set():  # busy in Python, as a worker making its next batch: the main process's
        sum(range(10_000))  # handshakes with this process's resource sharer thread wait for its GIL
    done.wait()


def take(batches: list[EncodedBatch], form: str, state: str) -> tuple[float, float]:
    """(wall ms, CPU ms) per batch the main process spends in `get`, after the worker has made every batch."""
    context = mp.get_context("fork")
    queue, ready, done = context.Queue(), context.Event(), context.Event()
    process = context.Process(target=worker, args=(batches, form, state, queue, ready, done))
    process.start()
    if not ready.wait(300):
        stop_processes([process])
        raise SystemExit("the worker process made no batches in 300 s")
    time.sleep(0.2)  # the queue's writer thread starts sending
    wall = cpu = 0.0
    count = 0
    while True:
        while not queue._reader.poll(1.0):  # the batch has arrived (the worker's pickling is not timed)
            if not process.is_alive():
                raise SystemExit("the worker process died")
        started, started_cpu = time.perf_counter(), time.thread_time()
        item = queue.get()
        wall += time.perf_counter() - started
        cpu += time.thread_time() - started_cpu
        if item is None:
            break
        count += 1
        del item
    done.set()
    stop_processes([process], grace=300)
    return 1000 * wall / count, 1000 * cpu / count


def raw_pass(path, batch_size: int, workers: int, slots: bool) -> float:
    """Images/s of a real device-path loader's workers alone (their EncodedBatches taken and dropped, no decode),
    median of two passes after a first; `slots`: in the workers' reused shared-memory slots, else in a fresh
    segment each (what a batch cost before)."""
    from fastdata.image.device.feeder import PassKey

    loader = fastdata.loader(path, decode="device", device="cpu", batch_size=batch_size, num_workers=workers)
    if not slots:
        loader._batches.buffers = None  # the workers get no slots: a fresh shared segment per batch
    rates = []
    for epoch in range(3):
        batches = loader._open_pass(PassKey(epoch))
        next(batches)
        started, count = time.perf_counter(), 0
        for batch in batches:
            count += len(batch)
            del batch
        rates.append(count / (time.perf_counter() - started))
    loader.close()
    return statistics.median(rates[1:])


def main() -> None:
    args = arguments(__doc__.split("\n")[0], images=3000, repeats=5, batch_size=256, batches=8).parse_args()
    path = dataset_for(args.data, args.images)
    ds = fastdata.dataset(path, "train", image_size=224)
    if len(ds) < args.batch_size * args.batches:
        raise SystemExit(f"{len(ds)} samples, {args.batch_size * args.batches} needed")
    batches = [pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(first, first + args.batch_size)], 0)
               for first in range(0, args.batch_size * args.batches, args.batch_size)]
    take(batches[:2], FORMS[0], STATES[0])  # warm-up
    cases = [(form, state) for state in STATES for form in FORMS]
    measured: dict[tuple[str, bool], list[tuple[float, float]]] = {case: [] for case in cases}
    alternate(cases, args.repeats, lambda case, _: measured[case].append(take(batches, *case)))
    rows = []
    for (form, state), runs in measured.items():
        before = measured[(FORMS[1], state)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        rows.append([state, form, f"{statistics.median(walls):.2f}",
                     f"{min(walls):.2f}-{max(walls):.2f}", f"{statistics.median(cpus):.2f}",
                     f"x{median_ratio([w for w, _ in before], walls):.2f}",
                     f"x{median_ratio([c for _, c in before], cpus):.2f}"])
    megabytes = statistics.mean(b.data.numel() + b.pixels.numel() for b in batches) / 2**20
    report.table(f"the main process taking a device-path batch from a worker: {args.batch_size} images "
                 f"({megabytes:.1f} MB of bytes and pixels) per batch, {args.batches} batches per run, "
                 f"{args.repeats} alternating runs", ["the worker meanwhile", "form", "ms per batch (wall, median)",
                                                       "range", "CPU ms per batch", "faster (wall)", "less CPU"],
                 rows, align="llrrrrr")
    rates: dict[bool, list[float]] = {True: [], False: []}
    alternate([True, False], args.repeats, lambda slots, _: rates[slots].append(
        raw_pass(path, args.batch_size, 2, slots)))
    report.table(f"a device-path loader's 2 workers alone (batches taken and dropped, batch {args.batch_size}, "
                 f"{args.repeats} alternating runs): each batch in a reused slot vs a fresh shared segment",
                 ["worker batches", "img/s (median)", "runs", "ratio"],
                 [[what, f"{statistics.median(rates[slots]):,.0f}", ", ".join(f"{x:,.0f}" for x in rates[slots]),
                   f"x{median_ratio(rates[slots], rates[False]):.2f}"]
                  for slots, what in ((True, "reused slots (today)"), (False, "a fresh segment each"))],
                 align="lrlr")


if __name__ == "__main__":
    main()
