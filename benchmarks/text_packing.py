"""Packed batches that know their documents, and best-fit packing: what they cost against plain packed blocks,
and how well best-fit fills its rows.

On the corpus of benchmarks/text_throughput.py (real English text found on this machine, its 32k byte-level BPE;
converted to LMDB once, in a child process):

- loading: `fastdata.loader` packed blocks (the plain rate), with `boundaries=True` (position_ids, cu_seqlens,
  max_seqlen), best-fit rows, and best-fit rows with boundaries, every one with the same DataLoader settings, one
  untimed epoch first, alternating over --repeats runs (`fastdata.tools.bench.run_contenders`); rates are
  positions (rows x seq_len, padding included) per second, ratios the medians of per-run ratios to the plain rate
  measured in the same run. Targets: boundaries >= 0.90, best-fit >= 0.80.
- best-fit rows (deterministic): positions that are padding, and documents cut, at --seq-len and 128, on the corpus
  and on --synthetic-documents documents of log-normal length (median ~245 tokens, a long tail); beside them the
  padding of next-fit in source order (each piece into the open row, else a new row). Targets at 1024: no
  document shorter than a row cut, padding <= 2%.
- planning: seconds to plan one epoch of --plan-documents synthetic documents (`fastdata.order.packing.plan_rows`,
  one core, the median of --repeats). Target: 10M documents in <= 10 s.

    python -m benchmarks.text_packing --mb 80 --repeats 3

Run nothing else heavy while it runs: the ratios and seconds are only as good as the machine is quiet.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from benchmarks import report
from benchmarks.text_corpus import corpus_and_tokenizer
from benchmarks.text_loaders import Pairs, fastdata_convert, in_fresh_process, loading_arguments
from fastdata.order.packing import Pieces, plan_rows
from fastdata.tools.bench import BenchConfig, Contender, LoaderResult, run_contenders
from fastdata.tools.bench_fair import dataset_files

LOADERS = {  # name -> the loader's text options
    "packed blocks (the plain rate)": {},
    "packed blocks, boundaries=True": {"boundaries": True},
    "best-fit rows": {"packing": "best-fit"},
    "best-fit rows, boundaries=True": {"packing": "best-fit", "boundaries": True},
}


def loading_table(path: Path, seq_len: int, config: BenchConfig) -> None:
    import fastdata

    settings = config.settings

    def contender(name: str, options: dict) -> Contender:
        def make() -> Iterable:
            return Pairs(fastdata.loader(path, text=fastdata.TextOptions(seq_len=seq_len, **options),
                                         batch_size=config.batch_size, **settings.loader_kwargs()))
        return Contender(LoaderResult(name), make, 2.0 * (seq_len + 1), dataset_files(path))

    results = run_contenders([contender(name, options) for name, options in LOADERS.items()], config,
                             progress=lambda line: print(f"  {line}", flush=True), what="the epoch")
    plain = results[0]
    rows = [[r.name, f"{r.images_per_s * seq_len / 1e6:,.2f}", f"{r.ratio_to(plain):.2f}x"] for r in results]
    report.table(f"loading, seq_len {seq_len}, batches of {config.batch_size}, {settings.num_workers} workers, "
                 f"LMDB; {config.warmup_passes} untimed + {config.epochs} timed epochs per run, medians of "
                 f"{config.repeats} alternating runs, ratios medians of per-run ratios",
                 ["loader", "M positions/s", "vs packed blocks"], rows)


def next_fit_padding(pieces: Pieces) -> float:
    """Padding of next-fit in source order: each piece into the open row if it fits, else into a new row."""
    sizes, seq_len = pieces.sizes.astype(np.int64), pieces.seq_len
    rows, room = 0, 0
    for size in sizes.tolist():
        if size > room:
            rows, room = rows + 1, seq_len
        room -= size
    return 1 - pieces.tokens / (rows * seq_len) if rows else 0.0


def quality_rows(name: str, ends: np.ndarray, seq_lens: list[int]) -> list[list[str]]:
    rows = []
    lengths = np.diff(ends, prepend=0)
    for seq_len in seq_lens:
        pieces = Pieces(ends, seq_len)
        plan = plan_rows(pieces, seed=0, epoch=0, shuffle=True)
        shorter = lengths < seq_len
        cut_short = int(np.count_nonzero(shorter & (np.diff(pieces.first) > 1)))  # by the plan's pieces
        rows.append([name, f"{seq_len:,}", f"{len(ends):,}", f"{plan.padding:.2%}", f"{next_fit_padding(pieces):.2%}",
                     f"{pieces.cut_documents:,}", f"{cut_short:,} of {int(shorter.sum()):,}"])
    return rows


def quality_table(path: Path, seq_len: int, synthetic: int) -> None:
    import fastdata

    ends = fastdata.dataset(path).store.ends
    lengths = np.random.default_rng(0).lognormal(5.5, 1.0, synthetic).astype(np.int64)
    seq_lens = sorted({seq_len, 128}, reverse=True)
    rows = quality_rows("the corpus", ends, seq_lens) + quality_rows("log-normal", np.cumsum(lengths), seq_lens)
    report.table("best-fit rows (seed 0, epoch 0; deterministic)",
                 ["corpus", "seq_len", "documents", "best-fit padding", "next-fit padding (source order)",
                  "documents cut (longer than a row)", "shorter than a row cut"], rows)


def planning_table(documents: int, seq_len: int, repeats: int) -> None:
    lengths = np.random.default_rng(1).lognormal(5.5, 1.0, documents).astype(np.int64)
    ends = np.cumsum(lengths)
    seconds = []
    for epoch in range(repeats):
        started = time.process_time()
        pieces = Pieces(ends, seq_len)
        plan = plan_rows(pieces, seed=0, epoch=epoch, shuffle=True)
        seconds.append(time.process_time() - started)
        print(f"  planning run {epoch + 1}: {seconds[-1]:.2f} s CPU, {len(plan):,} rows", flush=True)
    report.table(f"planning one epoch of {documents:,} log-normal documents at seq_len {seq_len} (one core, CPU "
                 f"seconds; median of {repeats})", ["documents", "pieces", "rows", "seconds"],
                 [[f"{documents:,}", f"{len(pieces):,}", f"{len(plan):,}", f"{statistics.median(seconds):.2f}"]])


def main() -> None:
    parser = loading_arguments(__doc__)
    parser.add_argument("--synthetic-documents", type=int, default=1_000_000)
    parser.add_argument("--plan-documents", type=int, default=10_000_000)
    args = parser.parse_args()

    corpus, tokenizer = corpus_and_tokenizer(args.data, args.mb)
    out = args.data / f"{corpus.stem}.lmdb"
    if not (out / "manifest.json").is_file():  # tokenized in a child: the loaders below fork this process
        in_fresh_process(fastdata_convert, str(corpus), str(tokenizer), str(out), "lmdb")
    config = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, workers=args.workers, repeats=args.repeats,
                         metered=False)
    print(f"corpus {corpus}, dataset {out}; DataLoader settings: {config.settings}", flush=True)
    loading_table(out, args.seq_len, config)
    quality_table(out, args.seq_len, args.synthetic_documents)
    planning_table(args.plan_documents, args.seq_len, args.repeats)


if __name__ == "__main__":
    main()
