"""Text conversion with default settings, each contender a whole process timed from its start to its exit (issue
"What round 2 left open", item 9), on the same JSONL corpus of real English text (benchmarks/text_corpus.py) and
the same 32k byte-level BPE tokenizer:

  (a) `fastdata convert text CORPUS OUT --tokenizer TOK` with its defaults (LMDB);
  (b) a ten-line script as a competent user writes it: read the JSONL, `encode_batch_fast` (tokenizers' own
      threads; the same ids as `encode_batch`, no offsets) on chunks of 2,000 documents, each document's ids and
      an end-of-text token joined with one `np.concatenate`, written as uint16 (what nanoGPT's prepare.py does);
  (c) HF `datasets`: `load_dataset("json")`, `map(tokenize, batched=True, num_proc=CORES)` (the same batched
      call), then packing into blocks of 1024 with numpy over the Arrow column (no Python loop per token, where
      HF's run_clm `group_texts` builds Python lists).

Alternating rounds; the table gives each contender's median tokens/s over the rounds and the ratio of fastdata's
median to each peer's, with the range of the per-round ratios.

    python -m benchmarks.text_convert --mb 80 --repeats 3
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks import report
from benchmarks.common import arguments

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from tokenizers import Tokenizer
    corpus, tokenizer, out = sys.argv[1:4]
    tok = Tokenizer.from_file(tokenizer)
    eos = np.array([tok.token_to_id("<|endoftext|>")], dtype=np.uint16)
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    parts = []
    for start in range(0, len(texts), 2000):
        for e in tok.encode_batch_fast(texts[start:start + 2000], add_special_tokens=False):
            parts += [np.array(e.ids, dtype=np.uint16), eos]
    ids = np.concatenate(parts)
    ids.tofile(out)
    print(len(ids))
""")

DATASETS = textwrap.dedent("""
    import sys
    import datasets
    import numpy as np
    from tokenizers import Tokenizer
    corpus, tokenizer, out, cores = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    datasets.disable_progress_bars()
    tok = Tokenizer.from_file(tokenizer)
    eos = tok.token_to_id("<|endoftext|>")
    block = 1024

    def tokenize(batch):
        return {"input_ids": [e.ids + [eos] for e in tok.encode_batch_fast(batch["text"], add_special_tokens=False)]}

    data = datasets.load_dataset("json", data_files=corpus, split="train", cache_dir=out)
    ids = data.map(tokenize, batched=True, num_proc=cores, remove_columns=data.column_names)
    flat = ids.data.column("input_ids").combine_chunks().flatten().to_numpy().astype(np.uint16)
    blocks = flat[: len(flat) // block * block].reshape(-1, block)  # packed, as run_clm's group_texts packs
    blocks.tofile(out + ".bin")
    print(len(flat))
""")


def run(argv: list[str], cwd: Path, counts: list[int] | None = None) -> float:
    """Seconds the process `argv` took, start to exit; raises if it failed. The token count it printed last is
    appended to `counts` (the peers print theirs: every contender must tokenize the same ids)."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed:\n{done.stderr[-2000:]}")
    if counts is not None:
        counts.append(int(done.stdout.split()[-1]))
    return seconds


def main() -> None:
    parser = arguments(__doc__, images=None, repeats=3, mb=80.0)
    args = parser.parse_args()

    from benchmarks.text_corpus import build_corpus, train_tokenizer

    corpus = build_corpus(args.data / f"text-{args.mb:g}mb.jsonl", args.mb)
    tokenizer = train_tokenizer(corpus, args.data / f"text-{args.mb:g}mb-bpe32k.json")
    work = args.data / "text_convert"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus.read_bytes()  # the page cache warm for all
    cores = os.cpu_count() or 2
    counts: list[int] = []
    contenders = {
        "(a) fastdata convert text, defaults": lambda: run(
            [sys.executable, "-m", "fastdata", "convert", "text", str(corpus), str(work / "out.lmdb"),
             "--tokenizer", str(tokenizer), "-q", "--overwrite"], work),
        "(b) a script: encode_batch_fast on chunks of 2,000 documents + np.concatenate": lambda: run(
            [sys.executable, "-c", SCRIPT, str(corpus), str(tokenizer), str(work / "ids.bin")], work, counts),
    }
    if subprocess.run([sys.executable, "-c", "import datasets"], capture_output=True, check=False).returncode == 0:
        def hf_datasets() -> float:
            shutil.rmtree(work / "hf", ignore_errors=True)  # its cache, so that each round tokenizes afresh
            return run([sys.executable, "-c", DATASETS, str(corpus), str(tokenizer), str(work / "hf"), str(cores)],
                       work, counts)

        contenders[f"(c) HF datasets map(batched=True, num_proc={cores}) + numpy packing"] = hf_datasets
        notes = []
    else:
        notes = ["(c) HF datasets: omitted (not installed)"]
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for round_number in range(args.repeats):
        for name, contender in contenders.items():
            seconds[name].append(contender())
            print(f"round {round_number + 1}: {name}: {seconds[name][-1]:.1f} s", flush=True)
    from fastdata.formats.manifest import read_manifest

    text = read_manifest(work / "out.lmdb").text
    tokens = text["total_tokens"] + text["documents"]  # fastdata stores no end-of-text token; the peers write one
    if any(count != tokens for count in counts):
        raise SystemExit(f"the peers wrote {sorted(set(counts))} tokens, fastdata {tokens} with an end-of-text "
                         "token per document: not the same work")
    size = corpus.stat().st_size / 1e6
    ours = seconds["(a) fastdata convert text, defaults"]
    rows = []
    for name, times in seconds.items():
        ratios = [t / o for t, o in zip(times, ours, strict=True)]
        rows.append([name, f"{tokens / statistics.median(times) / 1e6:.2f}",
                     f"{statistics.median(times) / statistics.median(ours):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"])
    report.table(f"{size:.1f} MB of JSONL, {tokens / 1e6:.1f} M tokens (end-of-text included), {cores} cores, "
                 f"{args.repeats} alternating rounds; whole processes, start to exit",
                 ["contender", "M tokens/s (median)", "fastdata x this (median; range over rounds)"], rows, notes=notes)


if __name__ == "__main__":
    main()
