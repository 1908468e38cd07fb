"""Peak resident memory of a loader and its workers, split by kind: each loader alone in a fresh process.

`benchmarks/cpu_path.py` measures peak RSS (loader + workers) with every contender in one benchmark process, which
also holds the decoded-ceiling bytes and what earlier contenders left behind, and whose forked workers count the
parent's pages again. Here each loader runs alone in a new Python process: the torchvision ImageFolder baseline
(PIL, RandomResizedCrop 224 + flip, `PILToTensor`) on the source JPEGs, and `fastdata.loader` (train preset) on the
LMDB of the same JPEGs; both batch 128, 2 workers, persistent workers, no pinning, --epochs passes. Every 5th batch
it reads /proc/PID/status of the loader's process and of every worker (RssAnon: heaps; RssFile: mapped files,
libraries included; RssShmem: shared memory, the batches in flight) and keeps the largest total. Linux only.

    python benchmarks/rss_split.py --images 4000 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

KINDS = ("RssAnon", "RssFile", "RssShmem")


def _status_mb(pid: int) -> dict[str, float]:
    found = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in KINDS:
                found[name] = int(value.split()[0]) / 1024
    return found


def measure(kind: str, source: str, epochs: int) -> dict[str, float]:
    """In a fresh process: iterate loader `kind` over `source`; the peak total RSS, split (MB)."""
    import psutil
    import torch

    if kind == "fastdata":
        import fastdata

        loader = fastdata.loader(source, batch_size=128, num_workers=2, persistent_workers=True, pin_memory=False)
    else:
        import torchvision
        from torchvision.transforms import v2

        dataset = torchvision.datasets.ImageFolder(source, v2.Compose(
            [v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.PILToTensor()]))
        loader = torch.utils.data.DataLoader(dataset, batch_size=128, num_workers=2, shuffle=True,
                                             persistent_workers=True, pin_memory=False)
    main = psutil.Process()
    peak: dict[str, float] = {}
    for _ in range(epochs):
        for step, batch in enumerate(loader):
            del batch
            if step % 5:
                continue
            split: dict[str, float] = {}
            for who, process in [("main", main)] + [("workers", p) for p in main.children(recursive=True)]:
                try:
                    for name, mb in _status_mb(process.pid).items():
                        split[f"{who} {name}"] = split.get(f"{who} {name}", 0.0) + mb
                except OSError:
                    continue
            if sum(split.values()) > sum(peak.values()):
                peak = split
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--data", default=".bench-data")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], args.epochs)))
        return
    from common import cached_sample_imagefolder

    import fastdata

    data = Path(args.data)
    source = cached_sample_imagefolder(data, args.images, jpeg_only=True)
    lmdb = data / f"rss-split-{args.images}.lmdb"
    if not lmdb.exists():
        fastdata.convert_imagefolder(source, lmdb, progress=False)
    runs: dict[str, list[dict[str, float]]] = {"torchvision ImageFolder + PIL": [], "fastdata": []}
    for _ in range(args.repeats):  # alternating
        for label, kind, path in (("torchvision ImageFolder + PIL", "torchvision", source),
                                  ("fastdata", "fastdata", lmdb)):
            done = subprocess.run([sys.executable, __file__, "--epochs", str(args.epochs), "--one", kind, str(path)],
                                  capture_output=True, text=True, check=True)
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    columns = [f"{who} {kind}" for who in ("main", "workers") for kind in KINDS]
    print(f"{args.images} JPEGs, batch 128, 2 workers, {args.epochs} epochs, medians of {args.repeats} runs (MB)\n")
    print("| loader | peak total | " + " | ".join(columns) + " |")
    print("|---|---:|" + "---:|" * len(columns))
    for label, found in runs.items():
        total = statistics.median(sum(run.values()) for run in found)
        cells = [f"{statistics.median(run.get(c, 0.0) for run in found):,.0f}" for c in columns]
        print(f"| {label} | {total:,.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
