"""Conversion at the speed of verification (issue 19): images/s of `fastdata convert imagefolder` against the
verification a converter must do, run bare in a fork pool, on the same photo-like JPEGs, in one run; and text
conversion with `--workers` against the tokenizer's fastest batched call and HF `datasets`.

Images (the benchmarks' sample photos, `benchmarks/common.py cached_sample_imagefolder(jpeg_only=True)`):
  (a) the baseline: `verify_in_pool` below, ~30 lines doing only what a converter must do per image (read the
      file, sha256 it, decode it at 1/8 DCT scale with `cv2.IMREAD_REDUCED_COLOR_8`) in a fork pool of --workers
      processes;
  (b) `fastdata convert imagefolder` to LMDB and to WebDataset shards (whole runs: listing, verifying, writing,
      hashing, manifest), the ratio to (a);
  (c) FFCV's writer (`DatasetWriter` with `RGBImageField(write_mode="jpg")`: it decodes and re-encodes every
      image, as it always does), or the row omitted with the reason when `import ffcv` fails;
  (d) a raw LMDB copy: every file's bytes put into LMDB in one process, nothing verified (what writing costs);
  (e) the conversion parent's CPU seconds per image and its workers' (getrusage of the conversion process, self
      and children), and from them the images/s predicted at 8, 16 and 64 cores, by this model: every image
      costs `w` CPU seconds in some worker and `p` in the parent (the writer), so on `c` cores the run is bounded
      by the total CPU, `c / (w + p)` images/s, and by the parent, a single process, `1 / p` images/s:
      `predicted(c) = min(c / (w + p), 1 / p)`. `p` and `w` are per-image costs, without the fixed ones (starting
      the workers, imports, the manifest): the same conversion of a small sample of --small images gives those,
      and p = (parent CPU of the run - of the small run) / (images - small images), w likewise. Both include
      everything else the conversion does per image (listing, writing, hashing the output); storage bandwidth
      is not in the model. The column "hashing the output" is the CPU that sha256 of the written files costs
      per image (measured after the run): part of `w` for LMDB (each record's digest, made in the worker that lays
      it out: `fastdata.formats.lmdb.record_digest`); WebDataset shards
      are written, flushed and hashed by processes of their own (`fastdata.convert.engines.assembly`), the writer only
      says where each sample's bytes go: their CPU per image `a` is reported on its own (each assembler writes
      its CPU time to a file as it ends), kept out of `w`, and added to the model as parallel work:
      `predicted(c) = min(c / (w + a + p), 1 / p)`.
  (f) `--engine ray` on a local Ray instance (LMDB), or the row omitted with the reason when `import ray` fails.
Each conversion runs in a fresh process (`python -c`, timed inside it: interpreter start excluded for all), every
one with OPENBLAS_NUM_THREADS=1 (what the `fastdata` command line sets).

Text (benchmarks/text_corpus.py's corpus of English text on this machine and its byte-level BPE tokenizer):
  (g) `fastdata convert text --workers N` (LMDB; in-process API call, reading, tokenizing, writing, manifest) vs
      `Tokenizer.encode_batch_fast` over every document already in memory, in one process (the tokenizer's own
      thread pool) vs HF `datasets`: `Dataset.from_dict(...).map(tokenize, batched=True, num_proc=N)` + packing
      into blocks (`group_texts` of the HF examples), when `datasets` is installed.

--repeats runs of every contender, alternating; the tables give medians and the median of the per-run ratios.
Targets (issue 19): images >= 0.8x (a), parent CPU per image <= 5% of a worker's; text >= 0.9x
encode_batch_fast and >= datasets map.

    python -m benchmarks.convert_speed --images 4000 --repeats 3 --text-mb 20

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import report

# ---------------------------------------------------------------------------------------------- (a) the baseline


def verify_one(path: str) -> int:
    """What a converter must do for one image: read it, hash it, prove it decodes (at 1/8 DCT scale)."""
    import cv2
    import numpy as np

    data = Path(path).read_bytes()
    hashlib.sha256(data).digest()
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_COLOR_8)
    if image is None:
        raise ValueError(f"{path}: does not decode")
    return len(data)


def one_opencv_thread() -> None:
    import cv2

    cv2.setNumThreads(1)


def verify_in_pool(files: list[str], workers: int) -> float:
    """Verify every file in a fork pool of `workers` processes; returns the seconds it took."""
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers, initializer=one_opencv_thread) as pool:
        for _ in pool.imap_unordered(verify_one, files, chunksize=32):
            pass
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------- runs in a child

_CHILD = r"""
import json, resource, sys, time
kind, src, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
assembler_cpu = []
if kind != "baseline" and kind != "raw-lmdb" and kind != "ffcv":
    import os, tempfile
    from fastdata.converters.imagefolder import convert_imagefolder
    import fastdata.convert.engines.assembly as assembly
    serve, report = assembly._serve, tempfile.mkdtemp()
    def counted_serve(*args):  # an assembler's own CPU, written where this process reads it after the run
        try:
            serve(*args)
        finally:
            with open(os.path.join(report, str(os.getpid())), "w") as file:
                file.write(str(cpu(resource.RUSAGE_SELF)))
    assembly._serve = counted_serve
started, parent_started = time.perf_counter(), cpu(resource.RUSAGE_SELF)
if kind == "baseline":
    from benchmarks import convert_speed
    from pathlib import Path
    files = sorted(str(p) for p in Path(src).rglob("*") if p.is_file())
    convert_speed.verify_in_pool(files, workers)
    images = len(files)
elif kind == "raw-lmdb":
    from benchmarks import convert_speed
    images = convert_speed.raw_lmdb_copy(src, out)
elif kind == "ffcv":
    from benchmarks import convert_speed
    images = convert_speed.ffcv_write(src, out, workers)
else:
    fmt, engine = kind.split("-")
    summary = convert_imagefolder(src, out, format=fmt, workers=workers, engine=engine, progress=False)
    images = summary.images
seconds = time.perf_counter() - started
if kind.startswith("wds"):
    assembler_cpu = [float(open(os.path.join(report, name)).read()) for name in os.listdir(report)]
print(json.dumps({"images": images, "seconds": seconds, "parent_cpu": cpu(resource.RUSAGE_SELF) - parent_started,
                  "workers_cpu": cpu(resource.RUSAGE_CHILDREN) - sum(assembler_cpu),
                  "assemblers_cpu": sum(assembler_cpu)}))
"""


def in_child(kind: str, src: Path, out: Path, workers: int) -> dict:
    """Run contender `kind` in a fresh Python process: its images, seconds, and its own CPU seconds during the
    run (its imports before it excluded) and its children's (the workers it waited for)."""
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    # every contender with one OpenBLAS thread, as the `fastdata` command line sets it: numpy's import otherwise
    # starts a thread per core that spins ~0.1 s (in the baseline's workers too: cv2 imports numpy)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    from benchmarks.common import ROOT  # here: the child imports this module inside its timing

    # run from the repository's root, which `python -c` puts first on the path: `benchmarks` imports from there
    done = subprocess.run([sys.executable, "-c", _CHILD, kind, str(src.resolve()), str(out.resolve()), str(workers)],
                          capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def raw_lmdb_copy(src: str, out: str) -> int:
    """(d) every file's bytes into LMDB, one process, transactions of 2048 puts, nothing verified."""
    import lmdb

    files = sorted(p for p in Path(src).rglob("*") if p.is_file())
    env = lmdb.open(out, map_size=1 << 36, sync=False, metasync=False)
    for start in range(0, len(files), 2048):
        with env.begin(write=True) as txn:
            for i, path in enumerate(files[start:start + 2048], start):
                txn.put(i.to_bytes(8, "big"), path.read_bytes(), append=True)
    env.sync(True)
    env.close()
    return len(files)


def ffcv_write(src: str, out: str, workers: int) -> int:
    """(c) FFCV's writer over the ImageFolder (RGBImageField, jpg: FFCV re-encodes every image)."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision.datasets import ImageFolder

    data = ImageFolder(src)
    fields = {"image": RGBImageField(write_mode="jpg"), "label": IntField()}
    DatasetWriter(out, fields, num_workers=workers).from_indexed_dataset(data)
    return len(data)


def unavailable(module: str) -> str | None:
    """Why `import module` fails in a fresh process (None: it works)."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["failed"])[-1]


# ---------------------------------------------------------------------------------------------- text


def text_contenders(corpus: Path, tokenizer: Path, workers: int, out: Path) -> dict[str, Callable[[], float]]:
    """Name -> a function that runs the contender once and returns its seconds."""
    import fastdata
    from benchmarks.text_corpus import iter_texts

    texts = list(iter_texts(corpus))

    def encode_batch_fast() -> float:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer))
        started = time.perf_counter()
        tok.encode_batch_fast(texts, add_special_tokens=False)
        return time.perf_counter() - started

    def fastdata_text() -> float:
        target = out / "text.lmdb"
        shutil.rmtree(target, ignore_errors=True)
        started = time.perf_counter()
        fastdata.convert_text(corpus, target, fastdata.TextConversionOptions(workers=workers, progress=False),
                              tokenizer=tokenizer)
        return time.perf_counter() - started

    contenders = {"encode_batch_fast, one process": encode_batch_fast,
                  f"fastdata convert text --workers {workers}": fastdata_text}
    reason = unavailable("datasets")
    if reason is None:
        def datasets_map() -> float:
            import datasets
            from tokenizers import Tokenizer

            datasets.disable_progress_bars()
            tok = Tokenizer.from_file(str(tokenizer))
            eos = tok.token_to_id("<|endoftext|>")
            block = 1024

            def tokenize(batch: dict) -> dict:
                encoded = tok.encode_batch_fast(batch["text"], add_special_tokens=False)
                return {"input_ids": [[*e.ids, eos] for e in encoded]}

            started = time.perf_counter()
            data = datasets.Dataset.from_dict({"text": texts})
            ids = data.map(tokenize, batched=True, num_proc=workers, remove_columns=["text"])
            flat = ids.data.column("input_ids").combine_chunks().flatten().to_numpy()  # packed with numpy, as
            flat[: len(flat) // block * block].reshape(-1, block)  # text_convert.py's (c) (no Python loop per token)
            return time.perf_counter() - started

        contenders[f"HF datasets map(batched=True, num_proc={workers}) + numpy packing"] = datasets_map
    else:
        print(f"  HF datasets: omitted ({reason})")
    return contenders


# ---------------------------------------------------------------------------------------------- report


def output_hash_seconds(out: Path) -> float:
    """CPU seconds to sha256 the data files of the dataset at `out` (what the writer's hashing costs; the page
    cache warm, as it is when the writer hashes)."""
    files = [p for p in out.rglob("*") if p.is_file() and p.name not in ("manifest.json", "lock.mdb")]
    for path in files:
        path.read_bytes()
    started = time.process_time()
    for path in files:
        hashlib.sha256(path.read_bytes()).digest()
    return time.process_time() - started


def median_ratio(times: dict[str, list[float]], name: str, baseline: str) -> float:
    """Median over runs of (baseline seconds / contender seconds): > 1 is faster than the baseline."""
    return statistics.median(b / c for b, c in zip(times[baseline], times[name], strict=True))


def main() -> None:
    from benchmarks.common import arguments, cached_sample_imagefolder  # here: the children import this module

    parser = arguments(__doc__, images=4000, repeats=3, workers=os.cpu_count() or 2, text_mb=20.0, skip_text=False)
    parser.add_argument("--small", type=int, default=48, help="images of the run that measures the fixed costs")
    parser.add_argument("--skip-peers", action="store_true", help="leave out FFCV and Ray (a quick check)")
    args = parser.parse_args()
    src = cached_sample_imagefolder(args.data, args.images, jpeg_only=True)
    small_src = cached_sample_imagefolder(args.data, args.small, jpeg_only=True)
    work = args.data / "convert_speed"
    work.mkdir(parents=True, exist_ok=True)
    for path in [*src.rglob("*"), *small_src.rglob("*")]:  # the page cache warm for all
        if path.is_file():
            path.read_bytes()
    kinds = {"(a) baseline: read + sha256 + decode 1/8, fork pool": "baseline",
             "(b) fastdata convert imagefolder -> LMDB": "lmdb-local",
             "(b) fastdata convert imagefolder -> WebDataset": "wds-local",
             "(d) raw LMDB copy, nothing verified (1 process)": "raw-lmdb"}
    for module, name, kind in (("ffcv", "(c) FFCV DatasetWriter (re-encodes)", "ffcv"),
                               ("ray", "(f) fastdata --engine ray (local Ray) -> LMDB", "lmdb-ray")):
        reason = "--skip-peers" if args.skip_peers else unavailable(module)
        if reason is None:
            kinds[name] = kind
        else:
            print(f"{name}: omitted ({reason})")
    runs: dict[str, list[dict]] = {name: [] for name in kinds}
    print(f"images: {args.images} photo-like JPEGs in {src}, {args.workers} workers, {args.repeats} repeats")
    for _ in range(args.repeats):
        for name, kind in kinds.items():
            runs[name].append(in_child(kind, src, work / kind, args.workers))
    times = {name: [r["seconds"] / r["images"] for r in results] for name, results in runs.items()}
    baseline = next(iter(kinds))
    report.table(f"{args.images} photo-like JPEGs, {args.workers} workers, medians of {args.repeats} alternating runs",
                 ["contender", "images/s", "x (a)"],
                 [[name, f"{statistics.median(r['images'] / r['seconds'] for r in results):,.0f}",
                   f"{median_ratio(times, name, baseline):.2f}"] for name, results in runs.items()])
    rows = []
    for name, kind in kinds.items():
        if not kind.endswith("-local"):
            continue
        small = [in_child(kind, small_src, work / f"{kind}-small", args.workers) for _ in range(args.repeats)]
        fixed_parent = statistics.median(r["parent_cpu"] for r in small)
        fixed_workers = statistics.median(r["workers_cpu"] for r in small)
        extra = runs[name][0]["images"] - small[0]["images"]
        parent = statistics.median((r["parent_cpu"] - fixed_parent) / extra for r in runs[name])
        worker = statistics.median((r["workers_cpu"] - fixed_workers) / extra for r in runs[name])
        assemblers = statistics.median((r["assemblers_cpu"] - statistics.median(s["assemblers_cpu"] for s in small))
                                       / extra for r in runs[name])
        predicted = " / ".join(f"{min(c / (worker + assemblers + parent), 1 / parent):,.0f}" for c in (8, 16, 64))
        hashing = output_hash_seconds(work / kind) / runs[name][0]["images"]
        where = "in the workers: a digest per record" if "lmdb" in kind else "elsewhere"
        rows.append([name[4:], f"{parent * 1e3:.3f}", f"{hashing * 1e3:.3f} ({where})", f"{worker * 1e3:.3f}",
                     f"{assemblers * 1e3:.3f}", f"{parent / worker:.1%}", predicted,
                     f"{fixed_parent:.3f}, {fixed_workers:.3f}"])
    report.table("the conversion's CPU per image (its fixed costs, from runs of --small images, left out)",
                 ["conversion", "parent CPU ms/image", "hashing the output", "workers CPU ms/image",
                  "assemblers CPU ms/image", "parent / worker", "predicted images/s at 8 / 16 / 64 cores",
                  "fixed CPU s: parent, workers"], rows, align="lrrrrrll")

    if args.skip_text:
        return
    from benchmarks.text_corpus import build_corpus, train_tokenizer

    corpus = build_corpus(args.data / f"convert_speed_text_{args.text_mb:g}mb.jsonl", args.text_mb)
    tokenizer = train_tokenizer(corpus, args.data / f"convert_speed_tokenizer_{args.text_mb:g}mb.json",
                                train_mb=min(args.text_mb, 16))
    contenders = text_contenders(corpus, tokenizer, args.workers, work)
    text_times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, run in contenders.items():
            text_times[name].append(run())
    megabytes = corpus.stat().st_size / 1e6
    first = next(iter(contenders))
    report.table(f"text: {megabytes:.1f} MB of JSONL", ["contender", "MB/s", "x encode_batch_fast"],
                 [[name, f"{megabytes / statistics.median(seconds):,.1f}",
                   f"{median_ratio(text_times, name, first):.2f}"] for name, seconds in text_times.items()])

if __name__ == "__main__":
    main()
