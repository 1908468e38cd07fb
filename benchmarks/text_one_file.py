"""One big text file (nanoGPT's `input.txt`: one document) converted with --workers 2: the document cut where the
tokenizer provably splits anyway and tokenized on both workers (the default), against the same conversion keeping
it whole (`split_documents=False`: one worker tokenizes it all, as before). Both store the same ids, checked here.

The file is the texts of benchmarks/text_corpus.py's corpus joined by blank lines, --mb MB of UTF-8, with the
corpus's 32k byte-level BPE. Each conversion runs in a fresh process, the two alternating over --repeats rounds;
the table gives each one's median tokens/s and the median of the per-round ratios. Target: >= 1.8x.

    python -m benchmarks.text_one_file --mb 80 --repeats 3
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

from benchmarks import report
from benchmarks.common import DATA, arguments
from benchmarks.text_corpus import corpus_and_tokenizer, iter_texts
from benchmarks.text_loaders import in_fresh_process

WHOLE = "kept whole: one worker tokenizes the document (split_documents=False)"
CUT = "cut where the tokenizer splits anyway, pieces on every worker (the default)"


def one_file(corpus: Path, out: Path, mb: float) -> Path:
    """The corpus's texts joined by blank lines into one .txt of at least `mb` MB (made once)."""
    if out.is_file():
        return out
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        written = 0
        while written < mb * 1e6:  # the corpus again if it is smaller than asked for
            for text in iter_texts(corpus):
                f.write(text + "\n\n")
                written += len(text.encode()) + 2
                if written >= mb * 1e6:
                    break
    tmp.rename(out)
    return out


def _convert(source: str, tokenizer: str, out: str, workers: int, split: bool) -> dict:
    import fastdata

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    summary = fastdata.convert_text(source, out, fastdata.TextConversionOptions(workers=workers, split_documents=split,
                                                                          progress=False), tokenizer=tokenizer)
    return {"seconds": time.perf_counter() - started, "tokens": summary.tokens, "notes": summary.notes}


def _same_ids(a: Path, b: Path) -> bool:
    import numpy as np

    import fastdata

    first, second = fastdata.dataset(a), fastdata.dataset(b)
    return len(first) == len(second) == 1 and np.array_equal(first.tokens(0), second.tokens(0))


def main() -> None:
    parser = arguments(__doc__, images=None, repeats=3, data=DATA / "text", mb=80.0, workers=2)
    args = parser.parse_args()

    corpus, tokenizer = corpus_and_tokenizer(args.data, args.mb)
    source = one_file(corpus, args.data / f"{corpus.stem}-one-file.txt", args.mb)
    outputs = {WHOLE: args.data / "one-file-whole.lmdb", CUT: args.data / "one-file-cut.lmdb"}
    print(f"{source} ({source.stat().st_size / 1e6:.1f} MB, one document), {args.workers} workers", flush=True)
    seconds: dict[str, list[float]] = {name: [] for name in outputs}
    tokens = 0
    for round_number in range(args.repeats):
        for name, out in outputs.items():
            result = in_fresh_process(_convert, str(source), str(tokenizer), str(out), args.workers, name == CUT)
            seconds[name].append(result["seconds"])
            tokens = result["tokens"]
            print(f"round {round_number + 1}: {name}: {result['seconds']:.1f} s {result['notes']}", flush=True)
    same = _same_ids(outputs[WHOLE], outputs[CUT])
    ratios = [w / c for w, c in zip(seconds[WHOLE], seconds[CUT], strict=True)]
    rows = [[name, f"{tokens / statistics.median(times) / 1e6:.2f}", f"{statistics.median(times):.1f}"]
            for name, times in seconds.items()]
    report.table(f"one {source.stat().st_size / 1e6:.1f} MB .txt file, {tokens / 1e6:.1f} M tokens, "
                 f"--workers {args.workers}; each conversion a fresh process, {args.repeats} alternating rounds",
                 ["conversion", "M tokens/s (median)", "seconds (median)"], rows,
                 notes=[f"cut / whole: {statistics.median(ratios):.2f}x (per-round {min(ratios):.2f}-"
                        f"{max(ratios):.2f}); the same ids: {'yes' if same else 'NO'}"])
    if not same:
        raise SystemExit("the two conversions stored different ids")


if __name__ == "__main__":
    main()
