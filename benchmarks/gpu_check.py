"""GPU decode check for decode="device": each decoder and nvImageCodec backend mix, decode only, one table.

    python -m benchmarks.gpu_check [--images 6144] [--repeats 2] [--json F] [--device cuda|cpu]

For every configuration, on the sample photos' JPEGs (the same files as benchmarks/gpu_train_feed.py):
1. pixels: each image decoded whole against Pillow's decode (libjpeg-turbo): max and mean absolute difference;
2. decode-only images/s, one batched call per 256 images, median of 3 alternating repeats: whole files, and by
   each train crop's covering region (RandomResizedCrop boxes drawn as the loader draws them), which is what the
   device path asks for; images the configuration could not decode (None) are counted.

Configurations: torchvision's decode_jpeg (nvjpeg); nvImageCodec with the library's own defaults (every backend, all
cores but one); fastdata's default over files that include progressive ones (hardware engines + hybrid, 4 CPU
threads) with and without reusing the decoded Images' buffers, and with the preallocation options the loader gives it
(DALI's: `preallocate_batch_size` and the dataset's size hints); the hardware engines with a 0.65 load hint
(DALI's) + hybrid; hybrid alone; hardware alone (baseline JPEGs only: progressive files come back None); with the
JPEG engines' utilisation where NVML exposes it. Then, over the same
photos converted with `--jpeg-layout baseline --non-jpeg jpeg` (every image a baseline JPEG, the PNGs re-encoded):
hardware + hybrid and the hardware engines alone (what `DeviceDecodeOptions(backends="auto")` chooses for such a
dataset), as one decoder and as two decoders called from two threads (a second batch in flight), and the engines
alone on each train crop's sub-JPEG over `--jpeg-layout restart --non-jpeg jpeg`; the two-decoder row settles whether a
second decode thread pays (only at >= 1.15x one decoder: said under the table). Last, the GPU time of the device path's
batched crop-resize-flip per batch of 256 photos, with CUDA events (benchmarks/resize_kernel.py on CUDA: its matrix
products in float16 and float32 against the per-tap gathers of the kernel before), and of its two weight matrices
alone, against the target of 1 ms per batch.

Needs torch + torchvision with CUDA and nvidia-nvimgcodec-cu13/-cu12 (`pip install 'fastdata[gpu-cu13]'`).
`--device cpu` runs what the CPU can (torchvision's decoder, the resize on the CPU): proof that it runs, figures
meaning nothing.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import fastdata
from benchmarks import report
from benchmarks.common import arguments
from fastdata.background import Background
from fastdata.image.device.decoders import decode_now  # each call's buffers handed back, as the feeder does

BATCH = 256
#: the target of the batched crop-resize-flip's GPU time per batch of 256 photos (ms)
RESIZE_TARGET_MS = 1.0
#: a second decoder and thread pay only when they make decoding this much faster than one
SECOND_DECODER_AT = 1.15


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def configurations(device: torch.device, hints: object = None) -> dict[str, object]:
    from fastdata.image.device.decoders import TorchvisionDecoder, nvimgcodec_missing
    from fastdata.image.device.options import DeviceDecodeOptions

    engine = "nvjpeg" if device.type == "cuda" else "libjpeg"
    found: dict[str, object] = {f"torchvision decode_jpeg ({engine})": TorchvisionDecoder(device)}
    if device.type != "cuda" or nvimgcodec_missing():
        print("nvImageCodec is not usable here:", nvimgcodec_missing() or "no CUDA device")
        return found
    from nvidia import nvimgcodec

    from fastdata.image.device.nvimgcodec import NvImageCodecDecoder

    cuda = torch.device("cuda")
    library = NvImageCodecDecoder(cuda, DeviceDecodeOptions())
    library._decoder = nvimgcodec.Decoder(device_id=torch.cuda.current_device())  # every backend, all cores - 1
    library.name = f"nvimgcodec {nvimgcodec.__version__} library defaults (all backends, {os.cpu_count() - 1} threads)"
    found[library.name] = library
    default = NvImageCodecDecoder(cuda, DeviceDecodeOptions())
    found[default.name + " [fastdata default where progressive JPEGs are stored]"] = default
    no_reuse = NvImageCodecDecoder(cuda, DeviceDecodeOptions())
    no_reuse.reuse = False
    found[no_reuse.name + ", Images not reused"] = no_reuse
    hinted = NvImageCodecDecoder(cuda, DeviceDecodeOptions(), hints)
    found[hinted.name + f", options {hinted.options!r} (as the loader makes it)"] = hinted
    for options in (DeviceDecodeOptions(hardware_load=0.65), DeviceDecodeOptions(backends=("hybrid",)),
                    DeviceDecodeOptions(backends=("hardware",)), DeviceDecodeOptions(cpu_threads=8)):
        decoder = NvImageCodecDecoder(cuda, options)
        found[decoder.name] = decoder
    return found


def agreement(decoder: object, payloads: list[np.ndarray], n: int = 256) -> dict[str, float]:
    from PIL import Image

    images = decode_now(decoder, payloads[:n])
    diffs, failed = [], 0
    for payload, image in zip(payloads[:n], images, strict=True):
        if image is None:
            failed += 1
            continue
        reference = np.asarray(Image.open(io.BytesIO(payload.tobytes())).convert("RGB")).transpose(2, 0, 1)
        diffs.append(np.abs(image.cpu().numpy().astype(np.int16) - reference.astype(np.int16)))
    return {"max": float(max(d.max() for d in diffs)), "mean": float(statistics.mean(d.mean() for d in diffs)),
            "failed": failed}


def rate(decoder: object, payloads: list[np.ndarray], regions: list | None) -> tuple[float, int]:
    device = decoder.device  # type: ignore[attr-defined]
    synchronize(device)
    started, failed = time.perf_counter(), 0
    for i in range(0, len(payloads), BATCH):
        images = decode_now(decoder, payloads[i:i + BATCH], None if regions is None else regions[i:i + BATCH])
        failed += sum(image is None for image in images)
    synchronize(device)
    return len(payloads) / (time.perf_counter() - started), failed


class JpegEngines:
    """The JPEG engines' utilisation (NVML, where exposed) sampled every 0.1 s while a block runs: (mean, max)."""

    def __init__(self) -> None:
        from fastdata.meter.gpu import Nvml

        self.nvml, self.reason = Nvml.open()

    def during(self, run: Callable[[], tuple[float, int]]) -> tuple[tuple[float, int], tuple[float, float] | None]:
        if self.nvml is None:
            return run(), None
        seen: list[float] = []

        def sample(stopping: threading.Event) -> None:
            while not stopping.wait(0.1):
                use = self.nvml.utilization()[0]
                if use is not None and use.jpeg_util_percent is not None:
                    seen.append(use.jpeg_util_percent)

        with Background(sample, "gpu-check-jpeg-sampler"):
            result = run()
        return result, ((statistics.mean(seen), max(seen)) if seen else None)


def rate_in_parallel(decoders: list, payloads: list[np.ndarray]) -> tuple[float, int]:
    """`rate` with one thread per decoder, each on a CUDA stream of its own, taking every len(decoders)-th batch:
    whether a second call in flight keeps the hardware engines busier than one decoder's calls in turn (each call
    waits for the decoder's batch before it). The threads are a fan-out joined at once, not background threads
    (fastdata.background): each runs to its end, and the first error is raised once all have ended."""
    chunks = [payloads[i:i + BATCH] for i in range(0, len(payloads), BATCH)]
    failed = [0] * len(decoders)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for chunk in chunks[k::len(decoders)]:
                    failed[k] += sum(image is None for image in decode_now(decoders[k], chunk))
            stream.synchronize()
        except BaseException as exc:  # raised below, on the main thread
            errors.append(exc)

    torch.cuda.synchronize()
    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(decoders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    torch.cuda.synchronize()
    return len(payloads) / (time.perf_counter() - started), sum(failed)


def main() -> None:
    parser = arguments(__doc__.split("\n")[0], images=6144, repeats=2, data=False, json=True)
    parser.add_argument("--out", default="benchmarks/data")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    from benchmarks.gpu_train_feed import dataset, jpegs
    from fastdata.image.device.auto import decoder_hints

    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke: figures mean nothing)"
    _, lmdb = dataset(Path(args.out), args.images)
    payloads, regions = jpegs(lmdb)
    reader = fastdata.dataset(lmdb).reader
    decoders = configurations(device, decoder_hints(BATCH, reader.widths, reader.heights))
    results: dict = {"machine": gpu, "gpu": gpu, "cores": os.cpu_count(), "jpegs": len(payloads),
                     "date": time.strftime("%Y-%m-%d"), "rows": {}}

    def save() -> None:  # after each part: a run cut short keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))

    engines = JpegEngines()
    for name, decoder in decoders.items():
        decode_now(decoder, payloads[:BATCH])  # warm-up
        results["rows"][name] = {"pixels": agreement(decoder, payloads), "whole": [], "regions": [],
                                 "jpeg_engines_percent": None}
    for repeat in range(args.repeats):
        order = list(decoders) if repeat % 2 == 0 else list(reversed(decoders))
        for name in order:
            decoder = decoders[name]
            row = results["rows"][name]
            measured, engine_use = engines.during(lambda decoder=decoder: rate(decoder, payloads, None))
            row["whole"].append(measured)
            row["jpeg_engines_percent"] = engine_use or row["jpeg_engines_percent"]
            if getattr(decoder, "regions", False) and "library defaults" in name:  # regions: known refused on 0.9
                row["regions"].append(rate(decoder, payloads, regions))
        save()
    rows = []
    for name, row in results["rows"].items():
        whole = statistics.median(r for r, _ in row["whole"])
        region = (f"{statistics.median(r for r, _ in row['regions']):,.0f} ({row['regions'][0][1]} not decoded)"
                  if row["regions"] else "n/a")
        pixels, use = row["pixels"], row["jpeg_engines_percent"]
        rows.append([name, f"{whole:,.0f}", region, row["whole"][0][1], f"{pixels['max']:.0f} / {pixels['mean']:.2f}",
                     f"{use[0]:.0f} / {use[1]:.0f}" if use else (engines.reason or "not exposed")])
    report.table(f"{gpu}, {results['cores']} cores, {len(payloads)} JPEGs, batches of {BATCH}: decode only, medians of "
                 f"{args.repeats} alternating repeats; pixels of the first 256 against Pillow",
                 ["decoder", "whole img/s", "by crop region img/s", "not decoded", "max / mean diff vs Pillow",
                  "JPEG engines % (mean / max)"], rows)
    if device.type == "cuda" and len(decoders) > 1:
        results["baseline_layout"] = baseline_layout(Path(args.out), args.images, args.repeats)
        save()
    results["resize"] = resize(Path(args.out), args.images, args.repeats, device, gpu)
    save()


def resize(data: Path, images: int, repeats: int, device: torch.device, gpu: str) -> dict:
    """The batched crop-resize-flip's time per batch (GPU time with CUDA events; wall time on the CPU), and its two
    weight matrices' alone, against RESIZE_TARGET_MS."""
    from benchmarks.resize_kernel import SIZE, measure, photo_batches
    from fastdata.image.device.kernels import cover, device_params, taps

    batches = max(1, min(4, images // BATCH))
    found = measure(data, images, min(BATCH, images), batches, repeats, device)
    photos = photo_batches(data, images, min(BATCH, images), batches, device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32

    def weights() -> None:
        from fastdata.image.device.kernels import axis_weights

        for _images, crops in photos:
            covered = cover(crops.boxes, crops.shapes)
            left, top, box_w, box_h, x0, y0, x1, y1, *_ = device_params(crops, covered, device).unbind(1)
            height, width = int((covered[:, 3] - covered[:, 1]).max()), int((covered[:, 2] - covered[:, 0]).max())
            axis_weights(top, box_h, y0, y1, SIZE[0], height, dtype, taps(crops.boxes[:, 3], SIZE[0]))
            axis_weights(left, box_w, x0, x1, SIZE[1], width, dtype, taps(crops.boxes[:, 2], SIZE[1]))

    weights()  # warm-up
    spans = []
    for _ in range(repeats):
        synchronize(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            weights()
            end.record()
            torch.cuda.synchronize()
            spans.append(start.elapsed_time(end) / len(photos))
        else:
            started = time.perf_counter()
            weights()
            spans.append(1000 * (time.perf_counter() - started) / len(photos))
    ms = found["ms_per_batch"]
    kernel = ms.get("matrix products, float16 (the CUDA default)") or ms["matrix products, float32"]
    whole, alone = statistics.median(kernel), statistics.median(spans)
    report.table(f"{gpu}: the device path's batched crop-resize-flip per batch of {min(BATCH, images)} photos "
                 f"({'GPU time, CUDA events' if device.type == 'cuda' else 'CPU wall time'}), target "
                 f"{RESIZE_TARGET_MS:g} ms", ["part", "ms per batch (median)", "within the target"],
                 [["the whole crop-resize-flip (as the loader runs it)", f"{whole:.3f}",
                   "yes" if whole <= RESIZE_TARGET_MS else "no"],
                  ["its two weight matrices alone (one fused pass each on CUDA)", f"{alone:.3f}", ""]], align="lrl")
    return {**found, "whole_ms": whole, "weights_ms": alone, "target_ms": RESIZE_TARGET_MS}


def baseline_layout(out: Path, images: int, repeats: int) -> dict[str, list[tuple[float, int]]]:
    """The same photos converted with `--jpeg-layout baseline --non-jpeg jpeg` (progressive files rewritten
    losslessly as baseline, PNGs stored as JPEGs): decode-only rates of fastdata's default mix and of the hardware
    engines alone (as one decoder, and as two on two threads), which now take every image; and of the engines
    alone on each train crop's sub-JPEG over `--jpeg-layout restart --non-jpeg jpeg` (what the workers ship
    there: only the MCUs the crop covers). (Over the original files the default gave 10,198 img/s and the engines
    alone 14,749 refusing the 19 progressive files: whether the hybrid decoder's share of each batch is what costs
    the difference.)"""
    from benchmarks.gpu_train_feed import dataset, jpegs
    from fastdata.image.device.nvimgcodec import NvImageCodecDecoder
    from fastdata.image.device.options import DeviceDecodeOptions

    _, lmdb = dataset(out, images, "baseline", non_jpeg="jpeg")  # gpu_train_feed's: every image a baseline JPEG
    payloads, _ = jpegs(lmdb)
    _, restart = dataset(out, images, "restart", non_jpeg="jpeg")
    subs, _ = jpegs(restart, sub_jpegs=True)
    cuda = torch.device("cuda")
    hardware = DeviceDecodeOptions(backends=("hardware",))
    decoders = {}
    for options in (DeviceDecodeOptions(backends=("hardware", "hybrid")), hardware):
        decoder = NvImageCodecDecoder(cuda, options)
        decode_now(decoder, payloads[:BATCH])  # warm-up
        chosen = " [fastdata default here: backends='auto']" if options is hardware else ""
        decoders[decoder.name + chosen] = decoder
    pair = [NvImageCodecDecoder(cuda, hardware) for _ in range(2)]
    on_subs = NvImageCodecDecoder(cuda, hardware)
    for decoder in [*pair, on_subs]:
        decode_now(decoder, payloads[:BATCH])  # warm-up
    measures: dict[str, Callable[[], tuple[float, int]]] = {
        name: (lambda decoder=decoder: rate(decoder, payloads, None)) for name, decoder in decoders.items()}
    measures[f"{pair[0].name}, two decoders on two threads and streams, batches alternating"] = (
        lambda: rate_in_parallel(pair, payloads))
    measures[f"{on_subs.name}, each train crop's sub-JPEG (--jpeg-layout restart --non-jpeg jpeg)"] = (
        lambda: rate(on_subs, subs, None))
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in measures}
    for repeat in range(repeats):
        for name in list(runs) if repeat % 2 == 0 else list(reversed(runs)):
            runs[name].append(measures[name]())
    one = statistics.median(r for r, _ in runs[next(name for name in decoders if "default here" in name)])
    two = statistics.median(r for r, _ in runs[next(name for name in runs if "two decoders" in name)])
    verdict = (f"two decoders on two threads / one decoder = {two / one:.2f}x: a second decode thread "
               f"{'pays' if two / one >= SECOND_DECODER_AT else 'does not pay'} (it would at >= {SECOND_DECODER_AT}x)")
    print(verdict)
    report.table(f"every image a baseline JPEG ({len(payloads)} of them; --jpeg-layout baseline --non-jpeg jpeg, or "
                 f"restart for the sub-JPEGs): decode only, medians of {repeats} alternating repeats",
                 ["decoder", "img/s", "spread", "not decoded"],
                 [[name, f"{statistics.median(r for r, _ in rows):,.0f}",
                   f"{max(r for r, _ in rows) - min(r for r, _ in rows):,.0f}", rows[0][1]]
                  for name, rows in runs.items()], notes=[verdict])
    return runs


if __name__ == "__main__":
    main()
