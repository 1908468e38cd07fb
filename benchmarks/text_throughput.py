"""Reproducible text benchmark: conversion tokens/s against `tokenizers`' own batched encoder (the ceiling),
and packed-block loading tokens/s against random blocks read from a flat `np.memmap` of the same tokens.

Builds (once, under benchmarks/data/text/) a corpus of real English text from files on this machine and a
32k byte-level BPE tokenizer trained on part of it (see text_corpus.py). Then, alternating the contenders
over --repeats runs and printing medians and ratios measured in the same run:

- conversion: `fastdata.convert_text` to LMDB and to WebDataset (whole runs: reading, JSON parsing,
  tokenizing, writing, hashing, manifest) vs `Tokenizer.encode_batch` / `encode_batch_fast` over the same
  texts already in memory, and `encode` one document at a time. Each runs in a fresh process; the peak RSS
  growth over the process after its imports is shown (the ceilings hold the whole corpus in memory).
- loading: random blocks of --seq-len tokens (+1 for the labels), batches of --batch-size, as
  {"input_ids", "labels"} int64: `fastdata.loader` (LMDB, WebDataset) with --workers workers; a flat uint16
  memmap through a DataLoader one block per item (nanoGPT-style dataset) and with whole-batch fetches; and
  in-process memmap slicing without a DataLoader (the ceiling).

    python benchmarks/text_throughput.py --mb 80 --repeats 3

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

sys.path.insert(0, str(Path(__file__).parent))
from text_corpus import build_corpus, iter_texts, train_tokenizer

# ------------------------------------------------------------------------------------------ conversion


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _ceiling(corpus: str, tokenizer: str, method: str, batch_chars: int, limit_mb: float | None) -> dict:
    """Tokenize the corpus texts (loaded in memory first, not timed) with the tokenizer's own API."""
    from fastdata.text_tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    base = _rss_mb()
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
            "rss_mb": _peak_rss_mb() - base}


def _fastdata_convert(corpus: str, tokenizer: str, out: str, fmt: str) -> dict:
    import fastdata

    if Path(out).exists():
        shutil.rmtree(out)
    base = _rss_mb()
    started = time.perf_counter()
    summary = fastdata.convert_text(corpus, out, tokenizer=tokenizer, format=fmt, progress=False)
    seconds = time.perf_counter() - started
    return {"tokens": summary.tokens, "seconds": seconds, "bytes": summary.bytes_in, "rss_mb": _peak_rss_mb() - base,
            "documents": summary.documents}


def _in_fresh_process(fn: Callable, *args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        return pool.apply(fn, args)


# --------------------------------------------------------------------------------------------- loading


class MemmapBlocks(Dataset):
    """nanoGPT-style: item k = block k of the flat token file, as int64 input/labels."""

    def __init__(self, path: Path, seq_len: int) -> None:
        self.path, self.seq_len = path, seq_len
        self.blocks = (path.stat().st_size // 2 - 1) // seq_len
        self._data: np.ndarray | None = None

    def _tokens(self) -> np.ndarray:
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint16, mode="r")
        return self._data

    def __len__(self) -> int:
        return self.blocks

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        block = torch.from_numpy(self._tokens()[k * self.seq_len:(k + 1) * self.seq_len + 1].astype(np.int64))
        return {"input_ids": block[:-1], "labels": block[1:]}

    def batch(self, ks: list[int]) -> dict[str, torch.Tensor]:
        data, n = self._tokens(), self.seq_len
        rows = np.stack([data[k * n:(k + 1) * n + 1] for k in ks]).astype(np.int64)
        return {"input_ids": torch.from_numpy(np.ascontiguousarray(rows[:, :-1])),
                "labels": torch.from_numpy(np.ascontiguousarray(rows[:, 1:]))}


class MemmapBatches(Dataset):
    """Whole-batch fetches: item = list of block indices -> one batch (HF datasets' batched __getitems__)."""

    def __init__(self, blocks: MemmapBlocks) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, ks: list[int]) -> dict[str, torch.Tensor]:
        return self.blocks.batch(ks)


def _memmap_ceiling(blocks: MemmapBlocks, batch_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    order = np.random.default_rng(seed).permutation(len(blocks))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        yield blocks.batch(order[start:start + batch_size].tolist())


def _time_batches(batches: Iterator[dict[str, torch.Tensor]], limit: int) -> tuple[float, float]:
    """(tokens/s after the first batch, seconds to the first batch) over at most `limit` batches."""
    started = time.perf_counter()
    first_at, tokens = None, 0
    for count, batch in enumerate(batches, 1):
        if first_at is None:
            first_at = time.perf_counter()
        else:
            tokens += batch["input_ids"].numel()
        if count >= limit:
            break
    end = time.perf_counter()
    assert first_at is not None
    return tokens / (end - first_at), first_at - started


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


def _row(name: str, values: list[float], baseline: float, unit_scale: float = 1e6, extra: str = "") -> str:
    median = statistics.median(values)
    return (f"| {name} | {median / unit_scale:,.2f} | {min(values) / unit_scale:,.2f}-{max(values) / unit_scale:,.2f} "
            f"| {median / baseline:.2f}x |{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data" / "text")
    parser.add_argument("--mb", type=float, default=80, help="Corpus size in MB of UTF-8 text.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--load-batches", type=int, default=600, help="Batches timed per loading run.")
    parser.add_argument("--one-at-a-time-mb", type=float, default=8,
                        help="Corpus MB for the one-document-at-a-time encode row (it is slow).")
    parser.add_argument("--skip-conversion", action="store_true")
    args = parser.parse_args()

    args.data.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(args.data / f"corpus-{args.mb:g}mb.jsonl", args.mb)
    tokenizer = train_tokenizer(corpus, args.data / f"{corpus.stem}-bpe-32k.json")
    outputs = {"lmdb": args.data / f"{corpus.stem}.lmdb", "wds": args.data / f"{corpus.stem}-wds"}
    cores = len(os.sched_getaffinity(0))
    print(f"corpus {corpus} ({corpus.stat().st_size / 1e6:.1f} MB JSONL), tokenizer {tokenizer.name}, "
          f"{cores} cores, torch {torch.__version__}")

    if not args.skip_conversion:
        conversions: dict[str, list[dict]] = {}
        contenders = {
            "`tokenizers` encode_batch (ceiling)": (_ceiling, str(corpus), str(tokenizer), "encode_batch", 4_000_000,
                                                    None),
            "`tokenizers` encode_batch_fast": (_ceiling, str(corpus), str(tokenizer), "encode_batch_fast", 4_000_000,
                                               None),
            "fastdata convert text -> LMDB": (_fastdata_convert, str(corpus), str(tokenizer), str(outputs["lmdb"]),
                                              "lmdb"),
            "fastdata convert text -> WebDataset": (_fastdata_convert, str(corpus), str(tokenizer),
                                                    str(outputs["wds"]), "wds"),
        }
        for repeat in range(args.repeats):
            for name, (fn, *fn_args) in contenders.items():
                result = _in_fresh_process(fn, *fn_args)
                conversions.setdefault(name, []).append(result)
                print(f"  run {repeat + 1}: {name}: {result['tokens'] / result['seconds'] / 1e6:.3f} M tokens/s "
                      f"({result['seconds']:.1f} s, peak RSS +{result['rss_mb']:.0f} MB)", flush=True)
        one = _in_fresh_process(_ceiling, str(corpus), str(tokenizer), "encode", 0, args.one_at_a_time_mb)
        conversions[f"`tokenizers` encode, one document at a time ({args.one_at_a_time_mb:g} MB)"] = [one]
        ceiling = statistics.median(r["tokens"] / r["seconds"] for r in conversions[next(iter(contenders))])
        first = conversions["fastdata convert text -> LMDB"][0]
        print(f"\nconversion: {first['documents']:,} documents, {first['tokens']:,} tokens, "
              f"{first['bytes'] / 1e6:.1f} MB in; medians of {args.repeats} (one-at-a-time: 1 run)\n")
        print("| conversion | M tokens/s | range | vs encode_batch | MB/s | peak RSS growth MB |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, results in conversions.items():
            rates = [r["tokens"] / r["seconds"] for r in results]
            mbs = statistics.median(r["bytes"] / r["seconds"] / 1e6 for r in results)
            rss = statistics.median(r["rss_mb"] for r in results)
            print(_row(name, rates, ceiling, extra=f" {mbs:,.2f} | {rss:,.0f} |"))

    import fastdata

    for fmt, out in outputs.items():  # tokenize in a child only: the loaders below fork this process
        if not (out / "manifest.json").is_file():
            _in_fresh_process(_fastdata_convert, str(corpus), str(tokenizer), str(out), fmt)
    flat = write_flat_stream(outputs["lmdb"], args.data / f"{corpus.stem}-stream.u16")
    blocks = MemmapBlocks(flat, args.seq_len)
    n, b, w = args.seq_len, args.batch_size, args.workers
    limit = min(args.load_batches, len(blocks) // b)

    def fastdata_loader(out: Path) -> Callable[[int], Iterator]:
        def make(seed: int) -> Iterator:
            return iter(fastdata.loader(out, seq_len=n, batch_size=b, num_workers=w, seed=seed,
                                        persistent_workers=False))
        return make

    def memmap_items(seed: int) -> Iterator:
        sampler = RandomSampler(blocks, generator=torch.Generator().manual_seed(seed))
        return iter(DataLoader(blocks, batch_size=b, sampler=sampler, num_workers=w, drop_last=True))

    def memmap_batches(seed: int) -> Iterator:
        sampler = BatchSampler(RandomSampler(blocks, generator=torch.Generator().manual_seed(seed)), b, True)
        return iter(DataLoader(MemmapBatches(blocks), sampler=sampler, batch_size=None, num_workers=w))

    loaders = {
        "in-process memmap slicing, no DataLoader (ceiling)": lambda seed: _memmap_ceiling(blocks, b, seed),
        f"flat np.memmap, one block per item, DataLoader {w} workers": memmap_items,
        f"flat np.memmap, whole-batch fetches, DataLoader {w} workers": memmap_batches,
        f"`fastdata.loader`, LMDB, {w} workers": fastdata_loader(outputs["lmdb"]),
        f"`fastdata.loader`, WebDataset, {w} workers": fastdata_loader(outputs["wds"]),
    }
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    firsts: dict[str, list[float]] = {name: [] for name in loaders}
    for repeat in range(args.repeats):
        for name, make in loaders.items():
            rate, first = _time_batches(make(repeat), limit)
            rates[name].append(rate)
            firsts[name].append(first)
        print(f"  loading run {repeat + 1} done", flush=True)
    ceiling = statistics.median(rates[next(iter(loaders))])
    baseline = statistics.median(rates[f"flat np.memmap, one block per item, DataLoader {w} workers"])
    print(f"\npacked loading: {len(blocks):,} blocks of {n}+1 tokens, batches of {b}, {limit} batches per run "
          f"(first batch timed apart), medians of {args.repeats}\n")
    print("| loader | M tokens/s | range | vs ceiling | vs memmap 1-per-item | first batch s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in loaders:
        median = statistics.median(rates[name])
        print(_row(name, rates[name], ceiling, extra=f" {median / baseline:.2f}x | "
                   f"{statistics.median(firsts[name]):.2f} |"))
    print(json.dumps({"load_rates": {k: statistics.median(v) for k, v in rates.items()}}))


if __name__ == "__main__":
    main()
