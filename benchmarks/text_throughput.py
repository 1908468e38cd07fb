"""Reproducible text benchmark: conversion tokens/s against `tokenizers`' fastest batched encoder (the ceiling),
and packed-block loading tokens/s against in-process slicing of a flat `np.memmap` of the same tokens.

Builds (once, under benchmarks/data/text/) a corpus of real English text from files on this machine and a
32k byte-level BPE tokenizer trained on part of it (see text_corpus.py). Then, alternating the contenders
over --repeats runs and printing medians and medians of per-run ratios measured in the same run:

- conversion: `Tokenizer.encode_batch_fast` over the texts already in memory (the ceiling: the tokenizer's
  fastest batched call, the one fastdata uses), `encode_batch` (same ids, with offsets), `fastdata.convert.text`
  to LMDB and to WebDataset (whole runs: reading, JSON parsing, tokenizing, writing, hashing, manifest), and
  `encode` one document at a time (on the first --one-at-a-time-mb of the corpus). Each runs in a fresh
  process (no warm-up for any); the corpus file is read once before the runs; the peak RSS growth over the
  process after its imports is shown (the in-memory rows hold the whole corpus).
- loading: one epoch of random blocks of --seq-len tokens (+1 for the labels), batches of --batch-size, as
  int64 {"input_ids", "labels"} (text_loaders.py): in-process memmap slicing without a DataLoader (the ceiling);
  nanoGPT's own `get_batch` (in-process, random offsets, no DataLoader); a map-style Dataset over the memmap
  through a DataLoader, one block per item and one batch per item; HF `datasets` through a DataLoader (optional:
  left out, with the reason, when `datasets` is not installed); `fastdata.loader` (LMDB, WebDataset). Every
  DataLoader gets fastdata.loader's settings with --workers workers, every loader one untimed epoch first,
  and every file is read once before timing (`fastdata.tools.bench.run_contenders`).

    python -m benchmarks.text_throughput --mb 80 --repeats 3

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks import report
from benchmarks.text_corpus import corpus_and_tokenizer, iter_texts
from benchmarks.text_loaders import (
    fastdata_contender,
    fastdata_convert,
    hf_blocks,
    hf_contender,
    in_fresh_process,
    loading_arguments,
    memmap_contenders,
    peak_rss_mb,
    rss_mb,
)
from fastdata.tools.bench import BenchConfig, Contender, LoaderResult, run_contenders
from fastdata.tools.bench_fair import alternate, median_ratio, warm_page_cache

# ------------------------------------------------------------------------------------------ conversion


def _ceiling(corpus: str, tokenizer: str, method: str, batch_chars: int, limit_mb: float | None) -> dict:
    """Tokenize the corpus texts (loaded in memory first, not timed) with the tokenizer's own API."""
    from fastdata.text.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    base = rss_mb()
    texts = list(iter_texts(Path(corpus), limit_mb))
    batches, current, size = [], [], 0
    for text in texts:
        current.append(text)
        size += len(text)
        if size >= batch_chars:
            batches.append(current)
            current, size = [], 0
    batches.append(current)
    tokens = 0
    started = time.perf_counter()
    if method == "encode":
        for text in texts:
            tokens += len(tok.encode(text, add_special_tokens=False).ids)
    else:
        encode = getattr(tok, method)
        for batch in batches:
            tokens += sum(len(e.ids) for e in encode(batch, add_special_tokens=False))
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": seconds, "bytes": sum(len(t.encode()) for t in texts),
            "rss_mb": peak_rss_mb() - base}


def write_flat_stream(dataset_path: Path, out: Path) -> Path:
    """The dataset's documents, each followed by its end-of-text token, as one flat uint16 file."""
    import fastdata

    if out.is_file():
        return out
    ds = fastdata.dataset(dataset_path)
    tokens = ds.store.read(0, ds.total_tokens)
    stream = np.insert(tokens, ds.store.ends, np.uint16(ds.eos_token_id))
    stream.astype("<u2").tofile(out)
    return out


# ------------------------------------------------------------------------------------------------ main


def _millions(rates: list[float]) -> list[str]:
    """The cells "M tokens/s" (the median) and "range" (the slowest and fastest run) of `rates` (tokens/s)."""
    return [f"{statistics.median(rates) / 1e6:,.2f}", f"{min(rates) / 1e6:,.2f}-{max(rates) / 1e6:,.2f}"]


def conversion_table(corpus: Path, tokenizer: Path, outputs: dict[str, Path], repeats: int, one_mb: float) -> None:
    ceiling = "`tokenizers` `encode_batch_fast` on the texts in memory (the ceiling)"
    contenders: dict[str, tuple] = {
        ceiling: (_ceiling, str(corpus), str(tokenizer), "encode_batch_fast", 4_000_000, None),
        "`tokenizers` `encode_batch` on the texts in memory (same ids, with offsets)":
            (_ceiling, str(corpus), str(tokenizer), "encode_batch", 4_000_000, None),
        "`fastdata convert text` -> LMDB": (fastdata_convert, str(corpus), str(tokenizer), str(outputs["lmdb"]),
                                            "lmdb"),
        "`fastdata convert text` -> WebDataset": (fastdata_convert, str(corpus), str(tokenizer),
                                                  str(outputs["wds"]), "wds"),
        f"`tokenizers` `encode`, one document at a time (first {one_mb:g} MB)":
            (_ceiling, str(corpus), str(tokenizer), "encode", 0, one_mb),
    }
    warm_page_cache([corpus])
    results: dict[str, list[dict]] = {name: [] for name in contenders}

    def run(name: str, repeat: int) -> None:
        fn, *fn_args = contenders[name]
        result = in_fresh_process(fn, *fn_args)
        results[name].append(result)
        print(f"  run {repeat + 1}: {name}: {result['tokens'] / result['seconds'] / 1e6:.3f} M tokens/s "
              f"({result['seconds']:.1f} s, peak RSS +{result['rss_mb']:.0f} MB)", flush=True)

    alternate(list(contenders), repeats, run)
    first = results["`fastdata convert text` -> LMDB"][0]
    base = [r["tokens"] / r["seconds"] for r in results[ceiling]]
    rows = []
    for name, runs in results.items():
        rates = [r["tokens"] / r["seconds"] for r in runs]
        mbs = statistics.median(r["bytes"] / r["seconds"] / 1e6 for r in runs)
        rss = statistics.median(r["rss_mb"] for r in runs)
        rows.append([name, *_millions(rates), f"{median_ratio(rates, base):.2f}x", f"{mbs:,.2f}", f"{rss:,.0f}"])
    report.table(f"conversion: {first['documents']:,} documents, {first['tokens']:,} tokens, "
                 f"{first['bytes'] / 1e6:.1f} MB in; medians of {repeats} alternating runs, ratios medians of per-run "
                 "ratios", ["conversion", "M tokens/s", "range", "vs `encode_batch_fast`", "MB/s",
                            "peak RSS growth MB"], rows)


def loading_table(results: list[LoaderResult], seq_len: int, config: BenchConfig, notes: list[str]) -> None:
    ceiling, items = results[0], results[2]  # the ceiling; the DataLoader over the memmap, one block per item
    rows = []
    for r in results:
        rates = [run.images_per_s * seq_len for run in r.runs]  # rows/s x tokens per row
        rows.append([r.name, *_millions(rates), f"{r.ratio_to(ceiling):.2f}x", f"{r.ratio_to(items):.2f}x",
                     f"{r.first_batch_s:.2f}"])
    report.table(f"packed loading: {config.warmup_passes} untimed + {config.epochs} timed epochs per run, blocks of "
                 f"{seq_len}+1 tokens, batches of {config.batch_size}; medians of {config.repeats} alternating runs, "
                 "ratios medians of per-run ratios",
                 ["loader", "M tokens/s", "range", "vs ceiling", "vs memmap 1-per-item", "first batch s"], rows,
                 notes=notes)
    print(json.dumps({"load_rates": {r.name: r.images_per_s * seq_len for r in results}}))


def main() -> None:
    parser = loading_arguments(__doc__)
    parser.add_argument("--one-at-a-time-mb", type=float, default=8,
                        help="Corpus MB for the one-document-at-a-time encode row (it is slow).")
    parser.add_argument("--skip-conversion", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="leave HF datasets out")
    args = parser.parse_args()

    corpus, tokenizer = corpus_and_tokenizer(args.data, args.mb)
    outputs = {"lmdb": args.data / f"{corpus.stem}.lmdb", "wds": args.data / f"{corpus.stem}-wds"}
    cores = len(os.sched_getaffinity(0))
    print(f"corpus {corpus} ({corpus.stat().st_size / 1e6:.1f} MB JSONL), tokenizer {tokenizer.name}, "
          f"{cores} cores, torch {torch.__version__}")
    if not args.skip_conversion:
        conversion_table(corpus, tokenizer, outputs, args.repeats, args.one_at_a_time_mb)

    for fmt, out in outputs.items():  # tokenize in a child only: the loaders below fork this process
        if not (out / "manifest.json").is_file():
            in_fresh_process(fastdata_convert, str(corpus), str(tokenizer), str(out), fmt)
    flat = write_flat_stream(outputs["lmdb"], args.data / f"{corpus.stem}-stream.u16")
    n = args.seq_len
    config = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, workers=args.workers, repeats=args.repeats,
                         metered=False)  # a bare loop: the ceiling's steps take ~0.2 ms
    print(f"DataLoader settings for every DataLoader and fastdata.loader: {config.settings}")
    contenders = memmap_contenders(flat, config, n)
    peers: list[Callable[[], Contender]] = [] if args.no_peers else [
        lambda: hf_contender(hf_blocks(flat, n, args.data / f"{corpus.stem}-hf-{n}"), config)]
    notes = ["HF datasets: omitted (--no-peers)"] if args.no_peers else []
    for build in peers:
        try:
            contenders.append(build())
        except ImportError as exc:
            notes.append(f"HF datasets: omitted ({exc}; pip install datasets, see benchmarks/README.md)")
    contenders += [fastdata_contender(outputs["lmdb"], config, n, "LMDB"),
                   fastdata_contender(outputs["wds"], config, n, "WebDataset")]
    results = run_contenders(contenders, config, progress=lambda line: print(f"  {line}", flush=True),
                             what="the epoch")
    loading_table(results, n, config, notes)


if __name__ == "__main__":
    main()
