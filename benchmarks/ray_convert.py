"""`--engine ray` against the local process pool on one machine, with a Ray cluster already running (issue "What
round 2 left open", item 8): `ray start --head --num-cpus N` first, then alternating rounds of

  (a) `fastdata.convert_imagefolder(SRC, OUT, workers=N)` (the local fork pool), and
  (b) the same call with `engine="ray", ray_address=<the cluster>` (N Ray workers),

each in a fresh Python process, timed from the call to its return (the imports before it excluded, the Ray
connection and the Ray workers' start included), over the same photo-like JPEGs, LMDB output. Then the scaling
model: what a conversion on `--nodes` x `--cores` would do, from what this run measured (the per-image work of a
Ray worker, the driver's CPU per image, the fixed start-up).

    python -m benchmarks.ray_convert --images 12000 --repeats 3
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from fastdata.converters.imagefolder import convert_imagefolder
    src, out, workers, engine, address = sys.argv[1:6]
    def cpu():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    started, parent = time.perf_counter(), cpu()
    options = {"engine": engine, "ray_address": address} if engine == "ray" else {}
    summary = convert_imagefolder(src, out, workers=int(workers), progress=False, **options)
    print(json.dumps({"images": summary.images, "seconds": time.perf_counter() - started,
                      "parent_cpu": cpu() - parent,
                      "ray_tasks": len(summary.ray.task_ids) if summary.ray else 0}))
""")


def in_child(src: Path, out: Path, workers: int, engine: str, address: str) -> dict:
    if out.exists():
        shutil.rmtree(out)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(out), str(workers), engine, address],
                          capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = arguments(__doc__, images=12000, repeats=3, workers=os.cpu_count() or 2)
    for name, default, meaning in (("--small", 240, "images of the run that measures the fixed costs"),
                                   ("--nodes", 4, "nodes of the modelled cluster"),
                                   ("--cores", 16, "cores per node of the modelled cluster")):
        parser.add_argument(name, type=int, default=default, help=meaning)
    args = parser.parse_args()

    src = cached_sample_imagefolder(args.data, args.images, jpeg_only=True)
    small = cached_sample_imagefolder(args.data, args.small, jpeg_only=True)
    for path in [*src.rglob("*"), *small.rglob("*")]:
        if path.is_file():
            path.read_bytes()
    work = args.data / "ray_convert"
    work.mkdir(parents=True, exist_ok=True)
    ray = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    subprocess.run([ray, "stop", "--force"], capture_output=True, check=False)
    started = subprocess.run([ray, "start", "--head", f"--num-cpus={args.workers}", "--disable-usage-stats",
                              "--include-dashboard=false"], capture_output=True, text=True, check=False)
    if started.returncode != 0:
        raise SystemExit(f"ray start failed:\n{started.stderr[-2000:]}")
    address = "auto"
    try:
        runs: dict[str, list[dict]] = {"local": [], "ray": []}
        for round_number in range(args.repeats):
            for engine in runs:
                runs[engine].append(in_child(src, work / f"{engine}.lmdb", args.workers, engine, address))
                print(f"round {round_number + 1}: {engine}: {runs[engine][-1]}", flush=True)
        fixed = [in_child(small, work / "ray-small.lmdb", args.workers, "ray", address) for _ in range(args.repeats)]
        fixed_local = [in_child(small, work / "local-small.lmdb", args.workers, "local", address)
                       for _ in range(args.repeats)]
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, check=False)
    rate = {engine: statistics.median(r["images"] / r["seconds"] for r in results) for engine, results in runs.items()}
    ratios = [r["seconds"] / y["seconds"] for r, y in zip(runs["local"], runs["ray"], strict=True)]
    # scaling model: seconds = fixed + images * max(work per image / workers, driver CPU per image)
    start_ray = statistics.median(r["seconds"] for r in fixed)
    start_local = statistics.median(r["seconds"] for r in fixed_local)
    extra = args.images - args.small
    per_image_ray = (statistics.median(r["seconds"] for r in runs["ray"]) - start_ray) / extra
    work_per_image = per_image_ray * args.workers  # a Ray worker's seconds per image (all workers busy)
    driver = statistics.median(r["parent_cpu"] for r in runs["ray"]) / args.images
    total = args.nodes * args.cores
    steady = min(total / work_per_image, 1 / driver)
    report.table(f"{args.images} photo-like JPEGs -> LMDB, {args.workers} workers, a running Ray cluster of "
                 f"{args.workers} CPUs on this machine, {args.repeats} alternating rounds",
                 ["engine", "images/s (median)", "x the local pool"],
                 [["local fork pool", f"{rate['local']:,.0f}", "1.00"],
                  ["--engine ray (running cluster)", f"{rate['ray']:,.0f}",
                   f"{rate['ray'] / rate['local']:.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})"]],
                 notes=[f"Ray fixed cost (a {args.small}-image run): {start_ray:.2f} s (local pool: {start_local:.2f} "
                        f"s); per image on one Ray worker {work_per_image * 1e3:.3f} ms; the driver's CPU "
                        f"{driver * 1e3:.3f} ms per image (its ceiling {1 / driver:,.0f} images/s)",
                        f"model on {args.nodes} nodes x {args.cores} cores ({total} Ray workers): steady "
                        f"{steady:,.0f} images/s ({'the driver' if steady == 1 / driver else 'the workers'} bound); "
                        f"1.28M images (ImageNet) in {start_ray + 1.28e6 / steady:,.0f} s"])


if __name__ == "__main__":
    main()
