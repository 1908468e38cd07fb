"""How long `fastdata --version`, `fastdata --help`, `python -c "import fastdata"` and a whole `fastdata convert
imagefolder` of 8 images (2 workers: the time to the first converted image is less) take to start, against
`python -c pass` (the interpreter's own start) in the same run: one untimed run of each, then --repeats rounds that
run every command once, in turn; the table gives the median and the fastest wall time of each, and the median of
the per-round differences from the baseline (what fastdata itself adds). `import torch` is timed alongside, as
the cost that these commands do not pay (they import torch only when a command needs it).

    python -m benchmarks.startup --repeats 20

Each command runs as a child process with its output thrown away; `fastdata` is the console script next to this
Python (or `python -m fastdata` where there is none).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import report
from benchmarks.common import arguments


def fastdata_command() -> list[str]:
    """The `fastdata` console script of this Python's environment, else `python -m fastdata`."""
    script = Path(sys.executable).parent / "fastdata"
    if script.is_file():
        return [str(script)]
    found = shutil.which("fastdata")
    return [found] if found else [sys.executable, "-m", "fastdata"]


def commands(scratch: Path) -> dict[str, list[str]]:
    """Label -> argv; the first is the baseline. `scratch` holds the conversion's 8 images and its output."""
    fastdata = fastdata_command()
    return {"python -c pass (baseline)": [sys.executable, "-c", "pass"],
            'python -c "import fastdata"': [sys.executable, "-c", "import fastdata"],
            "fastdata --version": [*fastdata, "--version"],
            "fastdata --help": [*fastdata, "--help"],
            "fastdata convert imagefolder (8 images)": [*fastdata, "convert", "imagefolder", str(scratch / "src"),
                                                        str(scratch / "out.lmdb"), "--overwrite", "--workers", "2",
                                                        "-q"],
            'python -c "import torch" (not paid)': [sys.executable, "-c", "import torch"]}


def wall_time(argv: list[str]) -> float:
    """Seconds from start to exit of `argv`; it must succeed."""
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def measure(runs: dict[str, list[str]], repeats: int) -> dict[str, list[float]]:
    """Label -> its wall times, one per round (after one untimed run of each)."""
    for argv in runs.values():
        wall_time(argv)
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(repeats):
        for label, argv in runs.items():
            times[label].append(wall_time(argv))
    return times


def main() -> None:
    parser = arguments(__doc__, images=None, repeats=20, data=False)  # --repeats: rounds, each runs every command
    parser.add_argument("--no-torch", action="store_true", help="leave out the `import torch` row")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    scratch = Path(tempfile.mkdtemp(prefix="fastdata-startup-"))
    from fastdata.tools.sample import make_sample_imagefolder

    make_sample_imagefolder(scratch / "src", images=8, classes=2, png_fraction=0.0, workers=1)
    runs = commands(scratch)
    if args.no_torch:
        runs = {label: argv for label, argv in runs.items() if "torch" not in label}
    times = measure(runs, args.repeats)
    baseline = times[next(iter(runs))]
    rows = []
    for label, seconds in times.items():
        over = statistics.median(t - b for t, b in zip(seconds, baseline, strict=True))
        rows.append([label, f"{statistics.median(seconds) * 1e3:.0f}", f"{min(seconds) * 1e3:.0f}",
                     f"{over * 1e3:.0f}"])
    report.table(f"start-up: medians of {args.repeats} rounds, Python {sys.version.split()[0]}, "
                 f"fastdata run as {' '.join(fastdata_command())}",
                 ["command", "median ms", "fastest ms", "over baseline ms"], rows)
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
