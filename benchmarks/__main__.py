"""The benchmark harness: one command for every benchmark in benchmarks/.

    python -m benchmarks list                          the suites and their benchmarks
    python -m benchmarks run SUITE [--smoke] [--repeats N] [--json OUT]
    python -m benchmarks tables [--check]              the READMEs' tables from benchmarks/results/*.json

`run` takes a suite (read, convert, text, device, memory, startup) or one benchmark's name; each benchmark runs in
a fresh Python process, one after another (run nothing else heavy meanwhile: the ratios are only as good as the
machine is quiet), its output shown as it comes. `--smoke` runs each at a tiny size (proof that it runs; its figures
mean nothing). `--json OUT` writes what was measured: the machine, and per benchmark its command, seconds, exit
status and tables. A benchmark that needs what this machine lacks (a module, a GPU) is left out, and the results
say why (a GPU benchmark with a CPU smoke run runs that instead under `--smoke`). The device suite first makes a
lent GPU machine ready (`benchmarks/device_setup.py`); a benchmark that writes its own results as it goes gets a
file beside OUT (`OUT-stem.NAME.json`).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from registry import BENCHMARKS, SUITES, Benchmark, select  # noqa: E402
from report import SINK, read_sink  # noqa: E402


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import psutil

    model = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            model = next((line.split(":", 1)[1].strip() for line in file if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version()}


@functools.cache
def has_cuda() -> bool:
    """Whether torch sees a CUDA GPU (asked in a child process: this one stays without CUDA and torch)."""
    return subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                          capture_output=True, check=False).returncode == 0


def on_cpu_instead(benchmark: Benchmark, smoke: bool) -> bool:
    """Whether a smoke run here runs `benchmark`'s CPU smoke (it needs a GPU, this machine has none)."""
    return smoke and benchmark.cpu_smoke is not None and "cuda" in benchmark.needs and not has_cuda()


def missing(benchmark: Benchmark, smoke: bool = False) -> str | None:
    """Why `benchmark` cannot run here (None: it can)."""
    for need in benchmark.needs:
        if need == "cuda":
            if not has_cuda() and not on_cpu_instead(benchmark, smoke):
                return "no CUDA GPU on this machine"
        elif importlib.util.find_spec(need) is None:
            return f"`{need}` is not installed (benchmarks/requirements-peers.txt)"
    return None


def command_of(benchmark: Benchmark, smoke: bool, repeats: int | None, json_file: Path | None = None) -> list[str]:
    """The command line that runs `benchmark` (`json_file`: where a benchmark that writes its own results does)."""
    target = list(benchmark.command) or [str(HERE / benchmark.file)]
    if on_cpu_instead(benchmark, smoke):
        args = list(benchmark.cpu_smoke or ())
    else:
        args = list(benchmark.smoke if smoke else benchmark.args)
    if repeats is not None and benchmark.takes_repeats:
        args += ["--repeats", str(repeats)]
    if json_file is not None and benchmark.writes_json:
        args += ["--json", str(json_file)]
    return [sys.executable, *target, *args]


def run_one(benchmark: Benchmark, smoke: bool, repeats: int | None, env: dict[str, str],
            json_file: Path | None = None) -> dict[str, Any]:
    """Run `benchmark` in a fresh process, its output passed through; its record for the results."""
    record: dict[str, Any] = {"benchmark": benchmark.name, "suite": benchmark.suite, "about": benchmark.about}
    reason = missing(benchmark, smoke)
    if reason is not None:
        print(f"\n== {benchmark.name}: left out ({reason})", flush=True)
        return {**record, "left_out": reason, "tables": []}
    if on_cpu_instead(benchmark, smoke):
        record["on_cpu"] = "no CUDA GPU here: the CPU smoke run (its figures mean nothing)"
    command = command_of(benchmark, smoke, repeats, json_file)
    shown = " ".join(Path(part).name if part.endswith(".py") else part for part in command[1:])
    print(f"\n== {benchmark.name}: python {shown}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        sink = os.path.join(scratch, "tables.jsonl")
        started = time.perf_counter()
        try:
            code = subprocess.run(command, env={**env, SINK: sink}, cwd=HERE.parent, check=False,
                                  timeout=None if smoke else benchmark.timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
            print(f"== {benchmark.name}: stopped after {benchmark.timeout:.0f} s", flush=True)
        seconds = time.perf_counter() - started
        tables = [table.to_json() for table in read_sink(sink)]
    print(f"== {benchmark.name}: {'done' if code == 0 else f'FAILED ({code})'} in {seconds:.0f} s", flush=True)
    if json_file is not None and benchmark.writes_json:
        record["results_file"] = str(json_file)
    return {**record, "command": f"python {shown}", "seconds": round(seconds, 1), "exit": code, "tables": tables}


def run(args: argparse.Namespace) -> int:
    chosen = select(args.suite)
    env = dict(os.environ)
    results: dict[str, Any] = {"suite": args.suite, "smoke": args.smoke,
                               "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(), "runs": []}
    if any(b.suite == "device" for b in chosen):
        from device_setup import describe_gpu, prepare

        log = Path(args.json).with_suffix(".setup.txt") if args.json else Path(tempfile.gettempdir()) / "setup.txt"
        env = prepare(log)
        results["machine"]["gpu"] = describe_gpu(env)
        print(f"GPU: {results['machine']['gpu']}", flush=True)
    for benchmark in chosen:
        own = Path(args.json).with_name(f"{Path(args.json).stem}.{benchmark.name}.json") if args.json else None
        results["runs"].append(run_one(benchmark, args.smoke, args.repeats, env, own))
        if args.json:  # written after each benchmark: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    failed = [r["benchmark"] for r in results["runs"] if r.get("exit", 0) != 0]
    left_out = [r["benchmark"] for r in results["runs"] if "left_out" in r]
    ran = len(results["runs"]) - len(failed) - len(left_out)
    print(f"\n{ran} ran, {len(failed)} failed{' (' + ', '.join(failed) + ')' if failed else ''}, "
          f"{len(left_out)} left out{' (' + ', '.join(left_out) + ')' if left_out else ''}"
          + (f"; results in {args.json}" if args.json else ""))
    return 1 if failed else 0


def list_all(_args: argparse.Namespace) -> int:
    for suite, question in SUITES.items():
        print(f"\n{suite}: {question}")
        for b in BENCHMARKS:
            if b.suite == suite:
                needs = f" [needs {', '.join(b.needs)}]" if b.needs else ""
                print(f"  {b.name:<24} {b.about}{needs}")
    return 0


def tables(args: argparse.Namespace) -> int:
    from tables import DOCUMENTS, check, update

    if args.check:
        drift = check(DOCUMENTS)
        for line in drift:
            print(line)
        return 1 if drift else 0
    for path in update(DOCUMENTS):
        print(f"rewrote the tables of {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="run a suite, or one benchmark")
    runner.add_argument("suite", help=f"one of {', '.join(SUITES)}, or a benchmark's name")
    runner.add_argument("--smoke", action="store_true", help="tiny sizes: proof that each runs")
    runner.add_argument("--repeats", type=int, default=None, help="runs of every contender (default: each's own)")
    runner.add_argument("--json", default=None, help="write the results here")
    runner.set_defaults(handler=run)
    commands.add_parser("list", help="the suites and their benchmarks").set_defaults(handler=list_all)
    writer = commands.add_parser("tables", help="write the READMEs' tables from benchmarks/results/")
    writer.add_argument("--check", action="store_true", help="only say where they differ (exit 1 if any)")
    writer.set_defaults(handler=tables)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
