"""The packed-block loaders that benchmarks/text_throughput.py times, each as a `fastdata.tools.bench.Contender`, so
that they all run through `run_contenders` (fastdata.loader's DataLoader settings for every DataLoader, one
untimed pass each, every file read once before timing, alternating runs, medians of per-run ratios).

Every loader yields batches of `batch` rows of `seq_len` input tokens (+1 for the labels), as int64
{"input_ids", "labels"}; for the shared timing loop they are handed over as (input_ids, labels). One pass is
one epoch: `len(blocks) // batch` batches for the memmap and HF loaders, fastdata's own epoch for fastdata.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from benchmarks.common import DATA, BenchmarkParser, arguments
from fastdata.tools.bench import BenchConfig, Contender, LoaderResult
from fastdata.tools.bench_fair import dataset_files


def loading_arguments(description: str | None) -> BenchmarkParser:
    """The shared options (`common.arguments`) with the corpus and loading options of the text loading
    benchmarks: `--data` (benchmarks/data/text), `--mb`, `--seq-len`, `--batch-size`, `--workers`, `--epochs`."""
    return arguments(description, images=None, data=DATA / "text", mb=80.0, seq_len=1024, batch_size=32, workers=2,
                     epochs=2)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's RSS now, MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def fastdata_convert(corpus: str, tokenizer: str, out: str, fmt: str) -> dict:
    """`fastdata.convert_text` of `corpus` into `out` (format `fmt`): its tokens, seconds, bytes read, documents
    and the RSS it added (MB); run it `in_fresh_process`."""
    import fastdata

    if Path(out).exists():
        shutil.rmtree(out)
    base = rss_mb()
    started = time.perf_counter()
    summary = fastdata.convert_text(corpus, out, fastdata.TextConversionOptions(format=fmt, progress=False),
                                    tokenizer=tokenizer)
    seconds = time.perf_counter() - started
    return {"tokens": summary.tokens, "seconds": seconds, "bytes": summary.bytes_in, "rss_mb": peak_rss_mb() - base,
            "documents": summary.documents}


def in_fresh_process(fn: Callable, *args) -> dict:
    """`fn(*args)` in a new spawned process, not a daemon: `fastdata.convert_text` starts workers of its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# --------------------------------------------------------------------------------------------- loading


class Pairs:
    """A loader of {"input_ids", "labels"} dicts as (input_ids, labels) pairs, one epoch per iteration."""

    def __init__(self, loader: Iterable[dict[str, torch.Tensor]]) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in self.loader:
            yield batch["input_ids"], batch["labels"]


def _contender(name: str, make: Callable[[], Iterable], seq_len: int, files: list[Path]) -> Contender:
    return Contender(LoaderResult(name), lambda: Pairs(make()), 2.0 * (seq_len + 1), files)


# -------------------------------------------------------------------------------------- in-process, no DataLoader


class NanoGPTBatches:
    """nanoGPT's `get_batch` (train.py), in the training process, no DataLoader: the memmap opened again for
    every batch (as nanoGPT does, against a memory leak), `batch` random offsets anywhere in the stream
    (torch.randint, with replacement), each row sliced, `.astype(np.int64)`, `torch.from_numpy`, and
    `torch.stack`ed, inputs and labels sliced separately; on CUDA both pinned, as nanoGPT pins them.
    `batches` per pass, the same number as the other loaders' epochs."""

    def __init__(self, path: Path, seq_len: int, batch: int, batches: int, seed: int = 1337) -> None:
        self.path, self.block_size, self.batch_size, self.batches = str(path), seq_len, batch, batches
        torch.manual_seed(seed)  # nanoGPT: torch.manual_seed(1337 + seed_offset), then the global generator
        self.pin = torch.cuda.is_available()

    def get_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        data = np.memmap(self.path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - self.block_size, (self.batch_size,))
        x = torch.stack([torch.from_numpy((data[i:i + self.block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + self.block_size]).astype(np.int64)) for i in ix])
        if self.pin:
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for _ in range(self.batches):
            x, y = self.get_batch()
            yield {"input_ids": x, "labels": y}


class MemmapBlocks(Dataset):
    """Item k = block k of the flat token file (seq_len + 1 tokens from k * seq_len), as int64 input/labels."""

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
    """Whole-batch fetches: item = a list of block indices -> one batch (one np.stack, one int64 cast)."""

    def __init__(self, blocks: MemmapBlocks) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, ks: list[int]) -> dict[str, torch.Tensor]:
        return self.blocks.batch(ks)


class PermutedBlocks:
    """The ceiling: in the training process, no DataLoader, aligned blocks in a fresh permutation each pass,
    one np.stack and one int64 cast per batch."""

    def __init__(self, blocks: MemmapBlocks, batch: int, seed: int = 0) -> None:
        self.blocks, self.batch, self.rng = blocks, batch, np.random.default_rng(seed)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = self.rng.permutation(len(self.blocks))
        for start in range(0, len(order) - self.batch + 1, self.batch):
            yield self.blocks.batch(order[start:start + self.batch].tolist())


# -------------------------------------------------------------------------------------------------- contenders


def memmap_contenders(flat: Path, config: BenchConfig, seq_len: int) -> list[Contender]:
    """The ceiling, nanoGPT's get_batch, and a flat memmap through a DataLoader (one block per item; one batch
    per item)."""
    blocks = MemmapBlocks(flat, seq_len)
    b, settings = config.batch_size, config.settings
    w = settings.num_workers

    def items() -> Iterable:
        return DataLoader(blocks, batch_size=b, sampler=RandomSampler(blocks), drop_last=True,
                          **settings.dataloader_kwargs())

    def batches() -> Iterable:
        return DataLoader(MemmapBatches(blocks), sampler=BatchSampler(RandomSampler(blocks), b, True),
                          batch_size=None, **settings.dataloader_kwargs())

    per_pass = len(blocks) // b
    return [
        _contender("in-process memmap slicing, aligned blocks, one `np.stack` per batch, no DataLoader (ceiling)",
                   lambda: PermutedBlocks(blocks, b), seq_len, [flat]),
        _contender("nanoGPT `get_batch`: in-process memmap, random offsets, `torch.stack` per row, no DataLoader",
                   lambda: NanoGPTBatches(flat, seq_len, b, per_pass), seq_len, [flat]),
        _contender(f"map-style `Dataset` over a flat `np.memmap`, one block per item, DataLoader {w} workers",
                   items, seq_len, [flat]),
        _contender(f"the same, one whole batch per item (one `np.stack`), DataLoader {w} workers",
                   batches, seq_len, [flat]),
    ]


def fastdata_contender(path: Path, config: BenchConfig, seq_len: int, label: str) -> Contender:
    import fastdata

    settings = config.settings

    def make() -> Iterable:
        return fastdata.loader(path, text=fastdata.TextOptions(seq_len=seq_len), batch_size=config.batch_size,
                               **settings.loader_kwargs())

    return _contender(f"`fastdata.loader`, {label}, {settings.num_workers} workers", make, seq_len,
                      dataset_files(path))


def hf_blocks(flat: Path, seq_len: int, out: Path) -> Path:
    """The same blocks as an HF `datasets` dataset on disk (Arrow, one row of seq_len + 1 uint16 tokens per
    block), built once under a temporary name."""
    import datasets

    if (out / "dataset_info.json").is_file():
        return out
    tokens = np.memmap(flat, dtype=np.uint16, mode="r")
    count = (len(tokens) - 1) // seq_len
    rows = np.lib.stride_tricks.as_strided(tokens, (count, seq_len + 1), (2 * seq_len, 2))
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("uint16"), length=seq_len + 1)})
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    datasets.Dataset.from_dict({"tokens": np.array(rows)}, features=features).save_to_disk(str(tmp))
    os.replace(tmp, out)
    return out


def hf_contender(directory: Path, config: BenchConfig) -> Contender:
    """HF `datasets`: `load_from_disk` (memory-mapped Arrow) `.with_format("torch")`, through a DataLoader with
    random batches, which fetches each batch with the dataset's `__getitems__` (one Arrow read per batch)."""
    import datasets

    settings = config.settings
    data = datasets.load_from_disk(str(directory)).with_format("torch")
    files = sorted(p for p in directory.iterdir() if p.suffix == ".arrow")

    def make() -> Iterable:
        return DataLoader(data, batch_size=config.batch_size, sampler=RandomSampler(data), drop_last=True,
                          collate_fn=_hf_collate, **settings.dataloader_kwargs())

    seq_len = len(data[0]["tokens"]) - 1
    return _contender(f"HF `datasets` (Arrow), batched `__getitems__`, DataLoader {settings.num_workers} workers",
                      make, seq_len, files)


def _hf_collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    tokens = torch.stack([row["tokens"] for row in rows])
    return {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}
