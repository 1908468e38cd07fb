"""Does the loader keep a GPU training loop fed? The measurement the device path is judged by.

    python benchmarks/gpu_train_feed.py [--images 6144] [--models resnet18,resnet50] [--repeats 2] [--json F]

A real training loop (torchvision ResNet-18 and ResNet-50, bf16 autocast, channels_last, SGD, batch 256,
`cudnn.benchmark`), fed by each contender at one fixed batch shape (drop_last), timed over whole epochs after a
warm-up epoch (so the timed window holds an epoch boundary), contenders alternating over the repeats:

- the synthetic ceiling: the same step on one batch kept on the GPU;
- torchvision ImageFolder + DataLoader (RandomResizedCrop + flip + PILToTensor, every core as workers, persistent,
  pinned), normalised to bf16 channels_last on the GPU;
- fastdata decode="worker", fastdata decode="device", fastdata's defaults (device="cuda": `decode="auto"` takes
  what `fastdata tune --device cuda --step MODEL` measured, which this script runs before each model's loops, as
  a user would with their model; `--tune-budget` is shared between the models), and the defaults with
  num_workers=4 (and, for ResNet-50, 2);
- with 4 workers: `DeviceDecode(decode_ahead=True)` (decode and crop on two feeder threads), and decode="device"
  (whose `backends="auto"` takes the GPU's hardware JPEG engines alone where they pass its probe:
  fastdata.image.device.auto) over the photos converted with
  `--jpeg-layout baseline --non-jpeg jpeg` (every image a baseline JPEG, the PNGs re-encoded, lossy: the engines
  take them all, the workers decode none, and no decoding uses the GPU's SMs, which the training step needs), and
  over `--jpeg-layout restart --non-jpeg jpeg` (the workers ship each crop's sub-JPEG: the engines decode only the
  MCUs the crop covers); these two for ResNet-18, whose rate the decoder bounds. Also for ResNet-18, over the
  original conversion, `DeviceDecode(progressive="workers")` with 8 workers: the progressive files (and the PNGs)
  decoded in the workers, so that the device decoder gets baseline JPEGs only and `backends="auto"` gives them to
  the engines alone (whether the device path should do so by default where the engines are).

Also, in the same run: the decode-only rate of the device path's decoder over the same files (one batched call
per 256 images, the crops' regions as the loader asks for them), and the host CPU the whole loader used (its
process and its workers, in cores) while it fed the loop. Two tables (the decoder alone, the training feed);
`--json` keeps every figure.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

import report
from common import arguments, cached_sample_imagefolder
from hardening import dataset_for

BATCH = 256
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def dataset(out: Path, images: int, layout: str = "original", non_jpeg: str = "keep") -> tuple[Path, Path]:
    """The sample photos as an ImageFolder tree and as an LMDB dataset (`hardening.dataset_for`: `layout`
    "restart": every JPEG rewritten losslessly as baseline with a restart marker per MCU; "baseline": the
    progressive ones rewritten losslessly as baseline; `non_jpeg` "jpeg": the PNGs stored as JPEGs, lossy)."""
    return cached_sample_imagefolder(out, images), dataset_for(out, images, layout, non_jpeg)


class Step:
    """One training step of `model` (bf16 autocast, channels_last, SGD) on a batch already on the GPU."""

    def __init__(self, name: str) -> None:
        import torchvision

        self.name = name
        self.model = getattr(torchvision.models, name)(num_classes=1000).cuda().to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.loss(self.model(images), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def ceiling(step: Step, steps: int = 60) -> float:
    """Images/s of the step on one batch kept on the GPU."""
    images = torch.randn(BATCH, 3, 224, 224, device="cuda").to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (BATCH,), device="cuda")
    for _ in range(15):
        step(images, labels)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step(images, labels)
    torch.cuda.synchronize()
    return steps * BATCH / (time.perf_counter() - started)


def cpu_seconds() -> float:
    """CPU seconds of this process and its live children (the loader's workers)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


def feed(step: Step, make: Callable[[], Iterable], epochs: int, settle: int = 4) -> dict[str, Any]:
    """Images/s of `step` fed by the loader `make()` makes, over `epochs` whole epochs after one warm-up epoch;
    the same without the first `settle` batches of each epoch (the steady state, from CUDA events recorded after
    each step: no synchronisation in the loop); the host cores the process and its workers used meanwhile (the
    training thread included); and, on the device path, the feeder's host milliseconds per batch by part, with
    its waits for the workers and the training thread's waits for it (which of the two is short of batches)."""
    loader = make()
    try:
        for images, labels in loader:  # warm-up: workers, decoder, cuDNN's choice for this shape
            step(images, labels)
        torch.cuda.synchronize()
        stage = getattr(loader, "_stage", None)
        before = dict(stage.timings) if stage is not None else None
        cpu, started, count = cpu_seconds(), time.perf_counter(), 0
        marks: list[list[tuple[torch.cuda.Event, int]]] = []
        for _ in range(epochs):
            marks.append([])
            for images, labels in loader:
                step(images, labels)
                count += len(labels)
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                marks[-1].append((event, len(labels)))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        cores = (cpu_seconds() - cpu) / seconds
        steady_images = sum(n for epoch in marks for _, n in epoch[settle + 1:])
        steady_seconds = sum(epoch[settle][0].elapsed_time(epoch[-1][0]) / 1000 for epoch in marks
                             if len(epoch) > settle + 1)
        measured: dict[str, Any] = {"images_per_s": count / seconds,
                                    "steady_images_per_s": steady_images / steady_seconds, "cores": cores}
        if stage is not None:
            measured["decoder"] = loader.device_decoder
            batches = stage.timings["batches"] - before["batches"]
            measured.update({f"feeder_{part}_ms": 1000 * (stage.timings[part] - before[part]) / batches
                             for part in ("decode", "resize", "other", "workers", "starved")})
    finally:
        if hasattr(loader, "close_feeder"):
            loader.close_feeder()
        del loader
        wait_for_workers()
    return measured


def wait_for_workers(timeout: float = 30.0) -> None:
    gc.collect()
    deadline = time.monotonic() + timeout
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)


class OnDevice:
    """A torchvision DataLoader's uint8 batches, normalised to bf16 channels_last on the GPU."""

    def __init__(self, loader: Iterable) -> None:
        self.loader = loader
        self.mean, self.std = MEAN.cuda(), STD.cuda()

    def __iter__(self):
        for images, labels in self.loader:
            images = images.cuda(non_blocking=True).float().sub_(self.mean).div_(self.std)
            yield images.to(torch.bfloat16).contiguous(memory_format=torch.channels_last), labels.cuda(
                non_blocking=True)


HARDWARE_BASELINE = "fastdata decode='device', --jpeg-layout baseline --non-jpeg jpeg, num_workers=4"
HARDWARE_RESTART = ("fastdata decode='device', --jpeg-layout restart --non-jpeg jpeg (each crop's sub-JPEG), "
                    "num_workers=4")
PROGRESSIVE_IN_WORKERS = "fastdata DeviceDecode(progressive='workers'), num_workers=8"


def contenders(src: Path, lmdb: Path, baseline: Path, restart: Path, workers: int
               ) -> dict[str, Callable[[], Iterable]]:
    import fastdata

    def imagefolder() -> Iterable:
        from torch.utils.data import DataLoader
        from torchvision import datasets, transforms

        transform = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                        transforms.PILToTensor()])
        return OnDevice(DataLoader(datasets.ImageFolder(str(src), transform), batch_size=BATCH, shuffle=True,
                                   num_workers=workers, persistent_workers=True, pin_memory=True, drop_last=True))

    common = dict(batch_size=BATCH, device="cuda", dtype=torch.bfloat16, channels_last=True, drop_last=True)
    return {
        f"torchvision ImageFolder ({workers} workers)": imagefolder,
        f"fastdata decode='worker' ({workers} workers)": lambda: fastdata.loader(
            lmdb, decode="worker", num_workers=workers, **common),
        f"fastdata decode='device' ({workers} workers)": lambda: fastdata.loader(
            lmdb, decode="device", num_workers=workers, **common),
        "fastdata defaults": lambda: fastdata.loader(lmdb, **common),
        "fastdata defaults, num_workers=4": lambda: fastdata.loader(lmdb, num_workers=4, **common),
        HARDWARE_BASELINE: lambda: fastdata.loader(baseline, decode="device", num_workers=4, **common),
        HARDWARE_RESTART: lambda: fastdata.loader(restart, decode="device", num_workers=4, **common),
        "fastdata defaults, num_workers=2": lambda: fastdata.loader(lmdb, num_workers=2, **common),
        PROGRESSIVE_IN_WORKERS: lambda: fastdata.loader(
            lmdb, decode=fastdata.DeviceDecode(progressive="workers"), num_workers=8, **common),
        "fastdata DeviceDecode(decode_ahead=True), num_workers=4": lambda: fastdata.loader(
            lmdb, decode=fastdata.DeviceDecode(decode_ahead=True), num_workers=4, **common),
    }


#: Contenders run for some models only (the target they answer is set for those): name -> models.
ONLY_FOR = {"fastdata defaults, num_workers=2": {"resnet50"},
            HARDWARE_BASELINE: {"resnet18"}, HARDWARE_RESTART: {"resnet18"},  # the decoder's rate: the fast model
            PROGRESSIVE_IN_WORKERS: {"resnet18"}}


def jpegs(lmdb: Path, sub_jpegs: bool = False) -> tuple[list[np.ndarray], list[tuple[int, int, int, int]]]:
    """Every JPEG of the dataset (pinned host memory, as the workers hand them over) and its train crop's region;
    with `sub_jpegs` (a restart-layout dataset), each crop's sub-JPEG instead of the whole file, as the workers
    ship them there (`fastdata.image.device.ship.ship_sub_jpeg`)."""
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
        data = sample.data if shipped is None else shipped[0]
        payloads.append(torch.frombuffer(bytearray(data), dtype=torch.uint8).pin_memory().numpy())
    return payloads, regions


def decode_only(lmdb: Path, repeats: int = 3) -> dict[str, float | str]:
    """Images/s of the device path's decoder alone, as a loader with the default DeviceDecode makes it for this
    dataset (`backends="auto"`): every JPEG of the dataset (whole files, as the loader ships them by default), 256
    per batched call."""
    from fastdata.formats.manifest import read_manifest
    from fastdata.image.device.auto import baseline_only, device_decoder
    from fastdata.image.device.decoders import decode_now
    from fastdata.image.device.options import DeviceDecode

    kinds = read_manifest(lmdb).stats.get("gpu_kinds")
    decoder = device_decoder(torch.device("cuda"), DeviceDecode(), baseline_only(DeviceDecode(), kinds))
    payloads, regions = jpegs(lmdb)
    use_regions = DeviceDecode().regions and decoder.regions  # as the loader asks
    batches = [(payloads[i:i + BATCH], regions[i:i + BATCH] if use_regions else None)
               for i in range(0, len(payloads), BATCH)]
    decode_now(decoder, *batches[0])
    rates, failed = [], 0
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        failed = 0
        for chunk, chunk_regions in batches:
            images = decode_now(decoder, chunk, chunk_regions)
            failed += sum(image is None for image in images)
        torch.cuda.synchronize()
        rates.append(len(payloads) / (time.perf_counter() - started))
        del images
    return {"decoder": decoder.name, "regions": use_regions, "images_per_s": statistics.median(rates),
            "spread": max(rates) - min(rates), "not_decoded": failed}


def tune_for_defaults(lmdb: Path, budget_s: float, model: str) -> dict:
    """`fastdata tune --device cuda --step MODEL` for the defaults' options, as a user runs it once per dataset,
    machine and model (tune's advice: give it your step). With the model's step the device path is measured
    sharing the GPU (and the training process) with training, as it will run; without one (`--step none`, the
    run of 2026-12-04) tune measured the loaders alone and chose the device path for ResNet-18, which then fed
    the loop slower than decoding in the workers."""
    from fastdata.tools.tune import TuneConfig, run_tune

    started = time.perf_counter()
    result = run_tune(lmdb, TuneConfig(batch_size=BATCH, augment="train", dtype=torch.bfloat16, device="cuda",
                                       step=model, budget_s=budget_s, window_s=1.5))
    return {"seconds": time.perf_counter() - started, "step": model, "decode": result.entry.choice.decode,
            "num_workers": result.entry.choice.num_workers,
            "by_decode": {k: round(v.images_per_s) for k, v in result.entry.by_decode.items()}}


def main() -> None:
    parser = arguments(__doc__.split("\n")[0], images=6144, repeats=2, data=False, epochs=2,
                       workers=min(os.cpu_count() or 1, 16))
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--tune-budget", type=float, default=40.0)
    parser.add_argument("--out", default="benchmarks/data")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    begun = time.perf_counter()

    def say(*what: object) -> None:
        print(f"[{time.perf_counter() - begun:.0f}s]", *what, flush=True)

    src, lmdb = dataset(out, args.images)
    _, baseline = dataset(out, args.images, "baseline", non_jpeg="jpeg")  # every image a baseline JPEG
    _, restart = dataset(out, args.images, "restart", non_jpeg="jpeg")  # every image a JPEG with restart markers
    say("datasets ready")
    results: dict = {"machine": torch.cuda.get_device_name(), "cores": os.cpu_count(), "images": args.images,
                     "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    results["decode_only"] = decode_only(lmdb)
    say("decode only:", results["decode_only"])
    results["decode_only_baseline"] = decode_only(baseline)
    say("decode only, baseline layout, PNGs as JPEGs:", results["decode_only_baseline"])
    makers = contenders(src, lmdb, baseline, restart, args.workers)
    models = args.models.split(",")
    results["tune"] = {}
    for model in models:
        # the defaults' loaders read what this stored (tune.json beside the dataset), made when each is built
        results["tune"][model] = tune_for_defaults(lmdb, args.tune_budget / len(models), model)
        say(f"tune, step {model}:", results["tune"][model])
        step = Step(model)
        names = [name for name in makers if model in ONLY_FOR.get(name, {model})]
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        top = ceiling(step)
        for repeat in range(args.repeats):
            order = names if repeat % 2 == 0 else names[::-1]
            for name in order:
                measured = feed(step, makers[name], args.epochs)
                rows[name].append(measured)
                feeder = (f"; {measured['decoder']}; feeder ms/batch: decode {measured['feeder_decode_ms']:.1f}, "
                          f"resize {measured['feeder_resize_ms']:.1f}, other {measured['feeder_other_ms']:.1f}, "
                          f"waiting for the workers {measured['feeder_workers_ms']:.1f}; the training thread waited "
                          f"{measured['feeder_starved_ms']:.1f} ms/batch for the feeder"
                          if "feeder_decode_ms" in measured else "")
                say(f"{model} repeat {repeat} {name}: {measured['images_per_s']:,.0f} img/s (steady "
                    f"{measured['steady_images_per_s']:,.0f}), {measured['cores']:.1f} cores{feeder}")
        results[model] = {"ceiling": top, "rows": rows}
        del step
        torch.cuda.empty_cache()
    print_table(results, args.models.split(","))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def print_table(results: dict, models: list[str]) -> None:
    machine = (f"{results['machine']}, {results['cores']} cores, {results['images']} sample photos, batch {BATCH}, "
               f"torch {results['torch']}")
    decoder_rows = []
    for key, what in (("decode_only", "original files"),
                      ("decode_only_baseline", "--jpeg-layout baseline --non-jpeg jpeg")):
        decode = results[key]
        decoder_rows.append([what, decode["decoder"], f"{decode['images_per_s']:,.0f}", f"{decode['spread']:,.0f}",
                             decode["not_decoded"]])
    report.table(f"{machine}: the device path's decoder alone, decode only, {BATCH} images per batched call",
                 ["files", "decoder", "img/s", "spread", "not decoded"], decoder_rows, align="llrrr")
    rows = []
    for model in models:
        top = results[model]["ceiling"]
        rows.append([model, "synthetic ceiling (batch kept on the GPU)", f"{top:,.0f}", "", "100%", "", "", ""])
        for name, runs in results[model]["rows"].items():
            rates = [r["images_per_s"] for r in runs]
            rate = statistics.median(rates)
            steady = statistics.median(r["steady_images_per_s"] for r in runs)
            cores = statistics.median(r["cores"] for r in runs)
            rows.append([model, name, f"{rate:,.0f}", f"{max(rates) - min(rates):,.0f}", f"{rate / top:.0%}",
                         f"{steady:,.0f}", f"{steady / top:.0%}", f"{cores:.1f}"])
    report.table(f"{machine}: training loops fed by each loader, medians of alternating repeats (spread: max - min)",
                 ["model", "loader", "img/s, whole epochs (median)", "spread", "of ceiling", "steady state",
                  "of ceiling", "host cores"], rows, align="llrrrrrr",
                 notes=[f"fastdata tune --device cuda --step {model}: {tune['seconds']:.0f} s, chose decode="
                        f"{tune['decode']!r}, num_workers={tune['num_workers']} ({tune['by_decode']})"
                        for model, tune in results["tune"].items()])


if __name__ == "__main__":
    main()
