"""Start-up at scale: seconds from `import fastdata` to the first batch of `fastdata.loader(path, ...)`, and the
main process's peak RSS, for datasets of 10k, 100k and 1M tiny images and 10k .. 10M tiny text documents (LMDB and
WebDataset), each measured in a fresh child process, with `num_workers=0` and 2. The last three columns are the
growth against the smallest size of the same kind, format and workers: of the start-up after the import (open + 1st
batch), of the whole time to the first batch, and of the peak RSS (the target: 1M / 10k under 2x for time and RSS).

The datasets are made quickly and kept in `--data` (built once; a dataset there is reused when its manifest is):
images are a handful of distinct 16x16 JPEGs reused for every sample, each sample with its own key
(`cNNN/imgNNNNNNNN.jpg`) and label; text documents are 8..64 token ids from a small word-level `tokenizers`
tokenizer. Both are written through fastdata's own storage writers (`fastdata.formats.registry.storage`), so they
are real fastdata datasets with a valid manifest. Disk: about 0.5 KB per image and 0.1 KB per document in LMDB,
about 3.5 KB per image and 2 KB per document in WebDataset shards (tar headers): 1M images ~ 4 GB, 10M documents
~ 20 GB in WebDataset.

    python -m benchmarks.startup_scale --sizes 10k,100k,1M --text-sizes 10k,100k,1M,10M
    python -m benchmarks.startup_scale --sizes 10k,100k --text-sizes 10k,100k   # quick check

Every dataset's files are read once before it is measured (page cache warm for every size). Each child prints its
phases as JSON: import (`import fastdata`), open (`fastdata.loader(...)`), first batch
(`next(iter(loader))`), and `resource.getrusage(RUSAGE_SELF).ru_maxrss` (the main process only; the workers are
children and not counted), plus the RSS right after the import (the floor the dataset adds to).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import report
from benchmarks.common import arguments

CLASSES = 100
DISTINCT_IMAGES = 8
VOCAB_WORDS = 500
_SUFFIX = {"k": 10**3, "m": 10**6}


def parse_sizes(text: str) -> list[int]:
    """"10k,100k,1M" -> [10000, 100000, 1000000]."""
    sizes = []
    for part in filter(None, (p.strip().lower() for p in text.split(","))):
        scale = _SUFFIX.get(part[-1], 1)
        sizes.append(int(float(part[:-1] if part[-1] in _SUFFIX else part) * scale))
    return sizes


def size_name(n: int) -> str:
    for suffix, scale in (("M", 10**6), ("k", 10**3)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)


def tiny_jpegs() -> list[tuple[bytes, int, int]]:
    """A handful of distinct tiny JPEGs (bytes, width, height)."""
    import io

    from PIL import Image

    out = []
    rng = np.random.default_rng(0)
    for i in range(DISTINCT_IMAGES):
        pixels = rng.integers(0, 256, (16, 16 + i % 3, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        out.append((buffer.getvalue(), pixels.shape[1], pixels.shape[0]))
    return out


def _commit(manifest, partial: Path, out: Path) -> None:
    """Manifest last, then one rename (as a conversion commits its output)."""
    for name in ("progress.json",):
        (partial / name).unlink(missing_ok=True)
    manifest.write(partial)
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)


def build_images(out: Path, fmt: str, n: int) -> None:
    """`n` tiny-image samples in `fmt` at `out`, written by fastdata's storage writer."""
    from fastdata import __version__
    from fastdata.formats.manifest import Manifest
    from fastdata.formats.records import CODEC_CV_JPEG, ImageRecord
    from fastdata.formats.registry import WriterOptions, storage

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    writer = storage("image", fmt).open_writer(partial, WriterOptions(commit_every=8192))
    images = tiny_jpegs()
    counts = [0] * CLASSES
    try:
        for i in range(n):
            label = i % CLASSES
            data, width, height = images[i % len(images)]
            writer.add(ImageRecord(f"c{label:03d}/img{i:08d}.jpg", data, "jpg", label, width, height, CODEC_CV_JPEG))
            counts[label] += 1
            if writer.checkpoint_due():
                writer.checkpoint(json.dumps({"done": i + 1, "files": _finished(writer)}).encode())
        files = writer.close()
    except BaseException:
        writer.abort()
        raise
    manifest = Manifest(format=fmt, kind="image", num_samples=n, classes=[f"c{c:03d}" for c in range(CLASSES)],
                        class_counts=counts, files=files, fastdata_version=__version__,
                        source={"kind": "benchmark", "samples": n})
    _commit(manifest, partial, out)


def _finished(writer) -> list[dict]:
    from dataclasses import asdict

    return [asdict(entry) for entry in getattr(writer, "finished_shards", [])]


def write_tokenizer(path: Path) -> int:
    """A word-level tokenizer of VOCAB_WORDS words and an end-of-text token; returns the end-of-text id."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "<unk>": 1, **{f"w{i}": i + 2 for i in range(VOCAB_WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    tokenizer.save(str(path))
    return 0


def build_text(out: Path, fmt: str, n: int) -> None:
    """`n` tiny documents (8..64 token ids) in `fmt` at `out`, written by fastdata's text writer."""
    from fastdata import __version__
    from fastdata.formats.manifest import Manifest, sha256_file
    from fastdata.formats.registry import WriterOptions, storage
    from fastdata.formats.tokens import TOKENIZER_FILE, token_dtype

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    dtype = token_dtype(VOCAB_WORDS + 2)
    writer = storage("text", fmt).open_writer(partial, WriterOptions(dtype=dtype))
    eos_id = write_tokenizer(partial / TOKENIZER_FILE)
    rng = np.random.default_rng(1)
    pool = rng.integers(2, VOCAB_WORDS + 2, 1 << 16).astype(dtype)
    lengths = rng.integers(8, 65, 4096)
    total = longest = 0
    try:
        for i in range(n):
            length = int(lengths[i % len(lengths)])
            start = (i * 7919) % (len(pool) - length)
            writer.add(pool[start:start + length])
            total += length
            longest = max(longest, length)
            if writer.checkpoint_due():
                writer.checkpoint(json.dumps({"done": i + 1, "files": _finished(writer)}).encode())
        files, layout = writer.close()
    except BaseException:
        writer.abort()
        raise
    text = {"dtype": dtype.name, "documents": n, "total_tokens": total, "max_document_tokens": longest,
            "vocab_size": VOCAB_WORDS + 2, "tokenizer": TOKENIZER_FILE,
            "tokenizer_sha256": sha256_file(partial / TOKENIZER_FILE), "eos_token": "<|endoftext|>",
            "eos_token_id": eos_id, "pad_token": None, "pad_token_id": None, **layout}
    manifest = Manifest(format=fmt, kind="text", num_samples=n, classes=[], class_counts=[], files=files,
                        fastdata_version=__version__, text=text, source={"kind": "benchmark", "documents": n})
    _commit(manifest, partial, out)


def dataset(cache: Path, kind: str, fmt: str, n: int) -> Path:
    """The cached dataset, built when missing."""
    out = cache / f"{kind}-{size_name(n)}.{fmt}"
    if not (out / "manifest.json").is_file():
        started = time.perf_counter()
        (build_images if kind == "image" else build_text)(out, fmt, n)
        print(f"built {out} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return out


CHILD = r"""
import json, resource, sys, time
def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
t0 = time.perf_counter()
import fastdata
import torch  # noqa (fastdata.loader imports it; counted in the import floor)
import fastdata.loader
floor = rss_mb()
t1 = time.perf_counter()
path, kind, workers, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
options = dict(image_size=32, augment="train") if kind == "image" else dict(text=fastdata.TextOptions(seq_len=128))
loader = fastdata.loader(path, batch_size=batch, num_workers=workers, **options)
t2 = time.perf_counter()
it = iter(loader)
first = next(it)
t3 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "first_s": t3 - t2, "total_s": t3 - t0,
                  "floor_mb": floor, "peak_mb": peak}))
del it, loader
"""


def warm(path: Path) -> None:
    """Read every file of a dataset once, so that every size is measured with its files in the page cache."""
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        with open(file, "rb") as f:
            while f.read(16 << 20):
                pass


def measure(path: Path, kind: str, workers: int, batch: int) -> dict:
    """One fresh child's phases and RSS."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), kind, str(workers), str(batch)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{path} (num_workers={workers}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_run(path: Path, kind: str, workers: int, batch: int, repeats: int) -> dict:
    runs = [measure(path, kind, workers, batch) for _ in range(repeats)]
    return {key: float(np.median([r[key] for r in runs])) for key in runs[0]}


def main() -> None:
    parser = arguments(__doc__, images=None, repeats=1, data=Path("/tmp/fastdata-startup-scale"))
    parser.add_argument("--sizes", default="10k,100k,1M", help="image dataset sizes ('' for none)")
    parser.add_argument("--text-sizes", default="10k,100k,1M,10M", help="text dataset sizes ('' for none)")
    parser.add_argument("--formats", default="lmdb,wds")
    parser.add_argument("--workers", default="0,2", help="num_workers values")
    parser.add_argument("--batch-size", type=int, default=256, help="images per batch (text: 8 rows of 128 tokens)")
    parser.add_argument("--build-only", action="store_true", help="build the datasets, measure nothing")
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    workers = [int(w) for w in args.workers.split(",") if w]
    plan = [("image", n) for n in parse_sizes(args.sizes)] + [("text", n) for n in parse_sizes(args.text_sizes)]
    args.data.mkdir(parents=True, exist_ok=True)
    paths = {(kind, fmt, n): dataset(args.data, kind, fmt, n) for kind, n in plan for fmt in formats}
    if args.build_only:
        return

    rows = []
    for kind in ("image", "text"):
        for fmt in formats:
            for w in workers:
                base = None
                for k, n in plan:
                    if k != kind:
                        continue
                    warm(paths[(kind, fmt, n)])
                    got = median_run(paths[(kind, fmt, n)], kind, w, 8 if kind == "text" else args.batch_size,
                                     args.repeats)
                    print(f"  measured {kind} {fmt} {size_name(n)} num_workers={w}", flush=True)
                    base = base or got
                    # growth of what the dataset adds on top of the import: start-up time after the import,
                    # and the peak RSS (whole, the import included)
                    grow_t = (got["open_s"] + got["first_s"]) / max(base["open_s"] + base["first_s"], 1e-9)
                    grow_all = got["total_s"] / base["total_s"]
                    grow_m = got["peak_mb"] / base["peak_mb"]
                    rows.append([kind, fmt, size_name(n), w, f"{got['import_s']:.2f}", f"{got['open_s']:.2f}",
                                 f"{got['first_s']:.2f}", f"{got['total_s']:.2f}", f"{got['floor_mb']:.0f}",
                                 f"{got['peak_mb']:.0f}", f"{grow_t:.2f}x", f"{grow_all:.2f}x", f"{grow_m:.2f}x"])
    report.table("seconds from `import fastdata` to the first batch of `fastdata.loader`, and the main process's "
                 f"RSS (its workers not counted): each row the median of {args.repeats} fresh child processes, the "
                 "dataset's files in the page cache",
                 ["dataset", "format", "samples", "workers", "import s", "open s", "1st batch s", "total s",
                  "floor MB", "peak MB", "x start", "x total", "x RSS"], rows, align="llrrrrrrrrrrr",
                 notes=["x start: open + 1st batch (what the dataset adds after the import) against the smallest size "
                        "of the same kind, format and workers; x total: import to 1st batch, likewise; x RSS: the "
                        "main process's peak RSS, likewise. Target: under 2x at 1M vs 10k."])


if __name__ == "__main__":
    main()
