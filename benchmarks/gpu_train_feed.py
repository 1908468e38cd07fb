"""Does the loader keep a GPU training loop fed? The measurement the device path is judged by, in steady state.

    python -m benchmarks.gpu_train_feed [--images 6144] [--copies 4] [--models resnet18,resnet50] [--repeats 1]
                                        [--budget-s 250] [--tune-budget 0] [--json F] [--device cuda|cpu]

The protocol (docs/gpu.md, "Measuring it"; ../shared/notes/gpu-feeder-round4.md sec. 5):
- data: the sample photos replicated `--copies` times (symlinks) as one ImageFolder tree, so that an epoch holds
  >= 96 batches of 256 for every contender; converted once as is and once with `--jpeg-layout baseline --non-jpeg
  jpeg` (every image a baseline JPEG, which the GPU's JPEG engines take);
- one fixed batch shape (`drop_last`), bf16 autocast, channels_last, SGD, the same `Step`, `cudnn.benchmark`;
- per model, the ceiling (the step on a batch kept on the GPU) first and last (its drift is reported);
- per contender, an untimed warm-up epoch (workers fork, decoders and allocations made), then one timed epoch:
  a CUDA event after each step, no synchronisation in the loop. The steady rate counts the steps after
  S = max(8, workers x prefetch + 4) (the pipeline has filled by then); the epoch-start stall (the gap between the
  warm-up epoch's last step and the timed epoch's first, less one ceiling step) has its own column; the whole
  epoch's rate is kept for reference only;
- for the device path, in the same process: the decode-only rate of the decoder its loader makes, and the loader
  alone (the same protocol, each batch touched by one kernel instead of a model step), with the feeder's threads'
  and streams' milliseconds per batch;
- host cores (the process and its workers, psutil) over the timed epoch;
- the JSON (`--json`) is written after every contender, so a run cut short keeps what it measured; every figure
  is named with the GPU it was measured on.

Contenders: torchvision ImageFolder + DataLoader (RandomResizedCrop + flip + PILToTensor, `--workers` workers);
fastdata decode="worker" (`--workers`); the device path (4 workers) over the original conversion and over the
baseline one (the engines alone: `backends="auto"`), and fastdata's defaults with device="cuda" (decode="auto":
the workers, unless `fastdata tune --device cuda --step MODEL` measured the device path faster: `--tune-budget`
seconds, 0 to skip tune). `--budget-s`: contenders that would start after this many seconds are left out (said),
so that the tables print within the harness's cap. `--device cpu` runs the whole protocol on the CPU with a tiny
model (its figures mean nothing: proof that the script runs, as `python -m benchmarks run device --smoke` does
where there is no GPU).
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder

BATCH = 256
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
DEVICE_WORKERS = 4  # the device path's workers: its host-core budget (targets: <= 6 cores in all)


# ----------------------------------------------------------------------------------------------------
# the protocol's arithmetic (pure: tests/test_gpu_protocol.py)


def settle_steps(workers: int, prefetch: int) -> int:
    """S: the steps left out before the steady window, once every batch in flight at an epoch's start has come."""
    return max(8, workers * prefetch + 4)


def steady(marks: list[float], images_per_step: int, settle: int) -> float | None:
    """Images/s over the steps after `settle`, from the times (seconds, one clock) at which each step ended; None
    when the epoch is too short to have a steady window."""
    if len(marks) < settle + 2:
        return None
    return (len(marks) - 1 - settle) * images_per_step / (marks[-1] - marks[settle])


def stall(last_of_warmup: float, first_of_timed: float, ceiling_step_s: float) -> float:
    """The epoch-start stall: the gap between one epoch's last step and the next one's first, less one step."""
    return max(0.0, first_of_timed - last_of_warmup - ceiling_step_s)


def replicate(src: Path, out: Path, copies: int) -> Path:
    """`src`'s ImageFolder tree `copies` times over as symlinks under `out` (each file once per copy, in its
    class), made once."""
    if out.is_dir():
        return out
    tmp = out.with_suffix(".tmp")
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        for copy in range(copies):
            link = tmp / path.parent.relative_to(src) / f"{path.stem}-{copy}{path.suffix}"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(path.resolve())
    tmp.rename(out)
    return out


def dataset(out: Path, images: int, layout: str = "original", non_jpeg: str = "keep") -> tuple[Path, Path]:
    """The sample photos (not replicated) as an ImageFolder tree and as an LMDB dataset (`hardening.dataset_for`;
    gpu_check's decode tables use them)."""
    from benchmarks.hardening import dataset_for

    return cached_sample_imagefolder(out, images), dataset_for(out, images, layout, non_jpeg)


def jpegs(lmdb: Path, sub_jpegs: bool = False) -> tuple[list[np.ndarray], list[tuple[int, int, int, int]]]:
    """Every JPEG of the dataset (pinned host memory where CUDA is, as the workers hand them over) and its train
    crop's region; with `sub_jpegs` (a restart-layout dataset), each crop's sub-JPEG instead of the whole file, as
    the workers ship them there (`fastdata.image.device.ship.ship_sub_jpeg`)."""
    import fastdata
    from fastdata.image.device.kernels import cover
    from fastdata.image.device.ship import ship_sub_jpeg
    from fastdata.order.epoch import sample_rng

    ds = fastdata.dataset(lmdb, "train", image_size=224)
    payloads, regions = [], []
    for i in range(len(ds)):
        sample = ds.encoded(i)
        if sample.codec != 0:
            continue
        params = ds.pipeline.preset.params(sample.width, sample.height, sample_rng(0, 0, *sample.position))
        box = np.array([[params.left, params.top, params.width, params.height]])
        regions.append(tuple(int(v) for v in cover(box, np.array([[sample.height, sample.width]]))[0]))
        shipped = ship_sub_jpeg(sample, params) if sub_jpegs else None
        data = torch.frombuffer(bytearray(sample.data if shipped is None else shipped[0]), dtype=torch.uint8)
        payloads.append((data.pin_memory() if torch.cuda.is_available() else data).numpy())
    return payloads, regions


def datasets(data: Path, images: int, copies: int) -> dict[str, Path]:
    """The replicated tree and its two conversions (made once, cached under `data`)."""
    import fastdata

    tree = replicate(cached_sample_imagefolder(data, images), data / f"imagefolder-{images}-x{copies}", copies)
    found = {"tree": tree}
    for name, layout in (("original", {}), ("baseline", {"jpeg_layout": "baseline", "non_jpeg": "jpeg"})):
        out = data / f"imagefolder-{images}-x{copies}-{name}.lmdb"
        if not out.exists():
            fastdata.convert_imagefolder(tree, out, fastdata.ImageFolderOptions(progress=False, **layout))
        found[name] = out
    return found


# ----------------------------------------------------------------------------------------------------
# the device the figures are measured on


class Clock:
    """A mark after each step: a CUDA event on the training stream (no synchronisation in the loop), or the host
    clock on the CPU; `seconds()` reads them all once the epoch is over."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self, origin: Any = None) -> list[float]:
        if not self.cuda:
            return [m - (origin if origin is not None else 0.0) for m in self.marks]
        torch.cuda.synchronize()
        base = origin if origin is not None else self.marks[0]
        return [base.elapsed_time(m) / 1000 for m in self.marks]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def card(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke: figures mean nothing)"


class Step:
    """One training step of `name` (bf16 autocast, channels_last, SGD) on a batch already on the device; on the
    CPU a tiny model (the protocol's smoke run)."""

    def __init__(self, name: str, device: torch.device) -> None:
        import torchvision

        self.name, self.device = name, device
        if device.type == "cuda":
            model = getattr(torchvision.models, name)(num_classes=1000)
        else:
            model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(48, 1000))
        self.model = model.to(device).to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = self.loss(self.model(images), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def touch(images: torch.Tensor, labels: torch.Tensor) -> None:
    """The loader-alone rows' step: one small kernel that reads the batch (its event then follows the batch)."""
    images[:1, :1, :1, :1] + labels[:1, None, None, None].to(images.dtype)


def ceiling(step: Step, device: torch.device, size: int, batch: int, steps: int = 60) -> float:
    """Images/s of the step on one batch kept on the device (15 untimed steps first)."""
    images = torch.randn(batch, 3, size, size, device=device).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    for _ in range(15):
        step(images, labels)
    clock = Clock(device)
    clock.mark()
    for _ in range(steps):
        step(images, labels)
    clock.mark()
    seconds = clock.seconds()
    return steps * batch / (seconds[-1] - seconds[0])


def cpu_seconds() -> float:
    """CPU seconds of this process and its live children (the loader's workers)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


# ----------------------------------------------------------------------------------------------------
# one contender


def feed(step: Callable[[torch.Tensor, torch.Tensor], None], make: Callable[[], Any], device: torch.device,
         settle: int, ceiling_step_s: float, batch: int) -> dict[str, Any]:
    """The protocol for one loader: an untimed warm-up epoch, then a timed one with a mark after each step."""
    loader = make()
    try:
        warm = Clock(device)
        for images, labels in loader:  # warm-up: workers, decoder, cuDNN's choice for this shape
            step(images, labels)
            warm.mark()
        stage = getattr(getattr(loader, "_device", None), "timings", None)
        before = dict(stage) if stage is not None else None
        clock = Clock(device)
        synchronize(device)
        cpu, started = cpu_seconds(), time.perf_counter()
        for images, labels in loader:
            step(images, labels)
            clock.mark()
        synchronize(device)
        wall = time.perf_counter() - started
        cores = (cpu_seconds() - cpu) / wall
        marks = clock.seconds(origin=warm.marks[-1])  # seconds since the warm-up epoch's last step
        measured: dict[str, Any] = {
            "steps": len(marks), "settle": settle, "steady_images_per_s": steady(marks, batch, settle),
            "epoch_images_per_s": len(marks) * batch / marks[-1] if marks else None,
            "epoch_start_stall_s": stall(0.0, marks[0], ceiling_step_s) if marks else None, "cores": cores}
        if stage is not None:
            batches = stage["batches"] - before["batches"]
            measured["decoder"] = loader.device_decoder
            measured["feeder_ms"] = {part: round(1000 * (stage[part] - before[part]) / max(batches, 1), 3)
                                     for part in stage if part != "batches"}
    finally:
        if hasattr(loader, "close"):
            loader.close()
        del loader
        wait_for_workers()
    return measured


def wait_for_workers(timeout: float = 30.0) -> None:
    gc.collect()
    deadline = time.monotonic() + timeout
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)


class OnDevice:
    """A torchvision DataLoader's uint8 batches, normalised to bf16 channels_last on the device."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader, self.device = loader, device
        self.mean, self.std = MEAN.to(device), STD.to(device)

    def __iter__(self):
        for images, labels in self.loader:
            images = images.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
            yield images.to(torch.bfloat16).contiguous(memory_format=torch.channels_last), labels.to(
                self.device, non_blocking=True)

    def close(self) -> None:
        pass


def contenders(data: dict[str, Path], workers: int, device: torch.device, size: int, batch: int
               ) -> dict[str, tuple[Callable[[], Any], int]]:
    """name -> (make the loader, its workers)."""
    import fastdata

    def imagefolder() -> Any:
        from torch.utils.data import DataLoader
        from torchvision import datasets as tv_datasets
        from torchvision import transforms

        transform = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                        transforms.PILToTensor()])
        return OnDevice(DataLoader(tv_datasets.ImageFolder(str(data["tree"]), transform), batch_size=batch,
                                   shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                                   pin_memory=device.type == "cuda", drop_last=True), device)

    common = dict(batch_size=batch, device=str(device), dtype=torch.bfloat16, channels_last=True, drop_last=True,
                  image_size=size)
    return {
        f"fastdata decode='device', --jpeg-layout baseline --non-jpeg jpeg, {DEVICE_WORKERS} workers": (
            lambda: fastdata.loader(data["baseline"], decode="device", num_workers=DEVICE_WORKERS, **common),
            DEVICE_WORKERS),
        f"torchvision ImageFolder ({workers} workers)": (imagefolder, workers),
        f"fastdata decode='worker' ({workers} workers)": (
            lambda: fastdata.loader(data["original"], decode="worker", num_workers=workers, **common), workers),
        f"fastdata decode='device', original files, {DEVICE_WORKERS} workers": (
            lambda: fastdata.loader(data["original"], decode="device", num_workers=DEVICE_WORKERS, **common),
            DEVICE_WORKERS),
        f"fastdata defaults, device={device.type}": (lambda: fastdata.loader(data["original"], **common), min(
            os.cpu_count() or 1, 16)),
        f"fastdata defaults, device={device.type}, {DEVICE_WORKERS} workers, --jpeg-layout baseline --non-jpeg jpeg": (
            lambda: fastdata.loader(data["baseline"], num_workers=DEVICE_WORKERS, **common), DEVICE_WORKERS),
    }


#: the device-path contenders whose loader-alone and decode-only rows are measured too: name -> dataset
DEVICE_ROWS = {f"fastdata decode='device', --jpeg-layout baseline --non-jpeg jpeg, {DEVICE_WORKERS} workers":
               "baseline",
               f"fastdata decode='device', original files, {DEVICE_WORKERS} workers": "original"}


def decode_only(lmdb: Path, device: torch.device, batch: int, repeats: int = 2) -> dict[str, Any]:
    """Images/s of the decoder the device path's loader makes for this dataset (with its preallocation hints),
    alone: every JPEG of the dataset, 256 per batched call, each call's buffers handed back at once."""
    import fastdata
    from fastdata.formats.manifest import read_manifest
    from fastdata.image.device.auto import baseline_only, decoder_hints, device_decoder
    from fastdata.image.device.decoders import decode_now
    from fastdata.image.device.options import DeviceDecodeOptions

    ds = fastdata.dataset(lmdb, "train", image_size=224)
    decoder = device_decoder(device, DeviceDecodeOptions(), baseline_only(DeviceDecodeOptions(),
                                                                   read_manifest(lmdb).stats.get("gpu_kinds")),
                             hints=decoder_hints(batch, ds.reader.widths, ds.reader.heights))
    payloads = []
    for i in range(min(len(ds), 16 * batch)):
        sample = ds.encoded(i)
        if sample.codec == 0:
            data = torch.frombuffer(bytearray(sample.data), dtype=torch.uint8)
            payloads.append((data.pin_memory() if device.type == "cuda" else data).numpy())
    batches = [payloads[i:i + batch] for i in range(0, len(payloads), batch)]
    decode_now(decoder, batches[0])
    rates, failed = [], 0
    for _ in range(repeats):
        synchronize(device)
        started, failed = time.perf_counter(), 0
        for chunk in batches:
            failed += sum(image is None for image in decode_now(decoder, chunk))
        synchronize(device)
        rates.append(len(payloads) / (time.perf_counter() - started))
    return {"decoder": decoder.name, "images_per_s": statistics.median(rates), "not_decoded": failed,
            "jpegs": len(payloads)}


def tune_for_defaults(lmdb: Path, budget_s: float, model: str, device: torch.device, batch: int) -> dict:
    """`fastdata tune --device cuda --step MODEL`, as a user runs it once per dataset, machine and model."""
    from fastdata.tools.tune import TuneConfig, run_tune

    started = time.perf_counter()
    result = run_tune(lmdb, TuneConfig(batch_size=batch, augment="train", dtype=torch.bfloat16, device=str(device),
                                       step=model, budget_s=budget_s, window_s=1.5))
    return {"seconds": time.perf_counter() - started, "step": model, "decode": result.entry.choice.decode,
            "num_workers": result.entry.choice.num_workers}


# ----------------------------------------------------------------------------------------------------
# the run


def main() -> None:
    parser = arguments(__doc__.split("\n")[0], images=6144, repeats=1, data=False, json=True,
                       workers=min(os.cpu_count() or 1, 16), batch_size=BATCH)
    parser.add_argument("--copies", type=int, default=4, help="replicas of the sample photos (>= 96 batches)")
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--budget-s", type=float, default=250.0)
    parser.add_argument("--tune-budget", type=float, default=0.0)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--out", default="benchmarks/data")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    begun = time.perf_counter()
    torch.backends.cudnn.benchmark = True

    def say(*what: object) -> None:
        print(f"[{time.perf_counter() - begun:.0f}s]", *what, flush=True)

    batch = args.batch_size
    results: dict[str, Any] = {"gpu": card(device), "cores": os.cpu_count(), "images": args.images,
                               "copies": args.copies, "batch": batch, "torch": torch.__version__,
                               "date": time.strftime("%Y-%m-%d"), "protocol": "steady state (docs/gpu.md)",
                               "decode_only": {}, "loader_alone": {}, "left_out": []}

    def save() -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(results, indent=1))

    data = datasets(Path(args.out), args.images, args.copies)
    say("datasets ready:", {k: str(v) for k, v in data.items()})
    for name, layout in DEVICE_ROWS.items():
        results["decode_only"][name] = decode_only(data[layout], device, batch)
        say("decode only,", layout, results["decode_only"][name])
        save()
    makers = contenders(data, args.workers, device, args.image_size, batch)
    for model in args.models.split(","):
        step = Step(model, device)
        top = ceiling(step, device, args.image_size, batch)
        row: dict[str, Any] = {"ceiling_first": top, "rows": {}}
        results[model] = row
        save()
        if args.tune_budget > 0:
            row["tune"] = tune_for_defaults(data["original"], args.tune_budget, model, device, batch)
            say("tune:", row["tune"])
        for name, (make, workers) in makers.items():
            if time.perf_counter() - begun > args.budget_s:
                results["left_out"].append(f"{model}: {name} (past --budget-s {args.budget_s:.0f})")
                continue
            settle = settle_steps(workers, 2)
            runs = [feed(step, make, device, settle, batch / top, batch) for _ in range(args.repeats)]
            row["rows"][name] = runs
            say(model, name, runs)
            save()
            if name in DEVICE_ROWS and name not in results["loader_alone"]:  # once, with the first model
                results["loader_alone"][name] = feed(touch, make, device, settle, 0.0, batch)
                say("loader alone:", name, results["loader_alone"][name])
                save()
        row["ceiling_last"] = ceiling(step, device, args.image_size, batch)
        save()
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_tables(results, args.models.split(","))
    save()


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def print_tables(results: dict[str, Any], models: list[str]) -> None:
    batch = results["batch"]
    where = (f"{results['gpu']}, {results['cores']} cores, the {results['images']} sample photos x{results['copies']}, "
             f"batch {batch}, torch {results['torch']}")
    rows = [[name, d["decoder"], f"{d['images_per_s']:,.0f}", d["not_decoded"]]
            for name, d in results.get("decode_only", {}).items()]
    report.table(f"{where}: the device path's decoders alone, decode only, {batch} images per batched call",
                 ["loader", "decoder", "img/s", "not decoded"], rows, align="llrr")
    rows = []
    for model in models:
        if model not in results:
            continue
        data = results[model]
        top = data["ceiling_first"]
        last = data.get("ceiling_last")
        drift = f"{last / top - 1:+.1%}" if last else "not measured"
        rows.append([model, f"ceiling (batch kept on the GPU; last: {drift})", f"{top:,.0f}", "100%", "", "", ""])
        for name, runs in data["rows"].items():
            rate = _median(runs, "steady_images_per_s")
            alone = results["loader_alone"].get(name)
            decode = results.get("decode_only", {}).get(name)
            note = ""
            if alone and decode and alone.get("steady_images_per_s"):
                note = (f"alone {alone['steady_images_per_s']:,.0f} img/s = "
                        f"{alone['steady_images_per_s'] / decode['images_per_s']:.0%} of decode-only")
            rows.append([model, name, f"{rate:,.0f}" if rate else "-", f"{rate / top:.0%}" if rate else "-",
                         f"{_median(runs, 'epoch_start_stall_s'):.2f}", f"{_median(runs, 'cores'):.1f}", note])
    report.table(f"{where}: training loops fed by each loader, steady state (steps after S = max(8, workers x "
                 "prefetch + 4) of a timed epoch after a warm-up epoch; CUDA events per step)",
                 ["model", "loader", "steady img/s", "of ceiling", "epoch-start stall s", "host cores",
                  "loader alone"], rows, align="llrrrrl",
                 notes=[f"left out: {what}" for what in results["left_out"]])


if __name__ == "__main__":
    main()
