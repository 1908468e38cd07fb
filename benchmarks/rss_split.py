"""Peak resident memory of a loader and its workers, split by kind: each loader alone in a fresh process.

`benchmarks/cpu_path.py` measures peak RSS (loader + workers) with every contender in one benchmark process, which
also holds the decoded-ceiling bytes and what earlier contenders left behind, and whose forked workers count the
parent's pages again. Here each loader runs alone in a new Python process: the torchvision ImageFolder baseline
(PIL, RandomResizedCrop 224 + flip, `PILToTensor`) on the source JPEGs, and `fastdata.loader` (train preset) on the
LMDB of the same JPEGs; both batch 128, 2 workers, persistent workers, no pinning, --epochs passes. Every 5th batch
it reads /proc/PID/status of the loader's process and of every worker (RssAnon: heaps; RssFile: mapped files,
libraries included; RssShmem: shared memory, the batches in flight) and keeps the largest total. Linux only.

    python -m benchmarks.rss_split --images 4000 --repeats 2
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

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
    from benchmarks import report  # here, not above: a child (`--one`) imports only what its loader needs
    from benchmarks.common import ROOT, arguments, cached_sample_imagefolder

    parser = arguments(__doc__.split("\n\n")[0], images=4000, repeats=2, epochs=2)
    args = parser.parse_args()
    import fastdata

    data = Path(args.data)
    source = cached_sample_imagefolder(data, args.images, jpeg_only=True)
    lmdb = data / f"rss-split-{args.images}.lmdb"
    if not lmdb.exists():
        fastdata.convert_imagefolder(source, lmdb, fastdata.ImageFolderOptions(progress=False))
    runs: dict[str, list[dict[str, float]]] = {"torchvision ImageFolder + PIL": [], "fastdata": []}
    for _ in range(args.repeats):  # alternating
        for label, kind, path in (("torchvision ImageFolder + PIL", "torchvision", source),
                                  ("fastdata", "fastdata", lmdb)):
            done = subprocess.run([sys.executable, "-m", "benchmarks.rss_split", "--one", kind, str(path.resolve()),
                                   str(args.epochs)], capture_output=True, text=True, check=True, cwd=ROOT)
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    columns = [f"{who} {kind}" for who in ("main", "workers") for kind in KINDS]
    report.table(f"{args.images} JPEGs, batch 128, 2 workers, {args.epochs} epochs, medians of {args.repeats} runs "
                 "(MB)",
                 ["loader", "peak total", *columns],
                 [[label, f"{statistics.median(sum(run.values()) for run in found):,.0f}",
                   *(f"{statistics.median(run.get(c, 0.0) for run in found):,.0f}" for c in columns)]
                  for label, found in runs.items()])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:  # a child of main(): one loader, and nothing imported but what it needs
        print(json.dumps(measure(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        main()
