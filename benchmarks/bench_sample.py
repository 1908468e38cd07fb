"""What `fastdata bench` prints on the sample of `fastdata demo`, kept as it printed it: the documents show that
output as a code block written from the results (benchmarks/README.md, "`fastdata bench` on the demo sample"),
so the sample a reader sees is one the harness recorded, on a named machine.

The sample photos of `fastdata.tools.sample` (1,200 by default, as the demo makes) in `train/`, converted with
`fastdata convert imagefolder train/ train.lmdb`, then, in that folder:

    fastdata bench train.lmdb --baseline-imagefolder train/ --epochs 2 --batch-size 128 --repeats 3

    python -m benchmarks.bench_sample
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from benchmarks import report
from benchmarks.common import arguments


def bench_command(epochs: int, batch_size: int, repeats: int) -> list[str]:
    """The command this benchmark runs, as a user types it in the sample's folder."""
    return ["fastdata", "bench", "train.lmdb", "--baseline-imagefolder", "train/", "--epochs", str(epochs),
            "--batch-size", str(batch_size), "--repeats", str(repeats)]


def main() -> None:
    args = arguments(__doc__, images=1200, repeats=3, epochs=2, batch_size=128).parse_args()
    from fastdata.converters.imagefolder import ImageFolderOptions, convert_imagefolder

    from fastdata.tools.sample import make_sample_imagefolder

    work = args.data / f"bench-sample-{args.images}"
    train, out = work / "train", work / "train.lmdb"
    if not out.exists():
        shutil.rmtree(work, ignore_errors=True)
        make_sample_imagefolder(train, images=args.images)
        convert_imagefolder(train, out, ImageFolderOptions(progress=False))
    command = bench_command(args.epochs, args.batch_size, args.repeats)
    print(f"$ {' '.join(command)}", flush=True)
    done = subprocess.run([sys.executable, "-m", "fastdata", *command[1:]], cwd=work, capture_output=True,
                          text=True, check=False)
    sys.stderr.write(done.stderr)
    print(done.stdout, flush=True)
    if done.returncode != 0:
        raise SystemExit(f"fastdata bench failed (exit {done.returncode})")
    report.output(f"$ {' '.join(command)}", done.stdout)


if __name__ == "__main__":
    main()
