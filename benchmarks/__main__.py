"""The benchmark harness: one command for every benchmark in benchmarks/.

    python -m benchmarks list                          the suites and their benchmarks
    python -m benchmarks run SUITE [--smoke] [--repeats N] [--json OUT]
    python -m benchmarks tables [--check [--complete]]  the documents' figures from benchmarks/results/*.json

`run` takes a suite (read, convert, text, device, memory, startup) or one benchmark's name; each benchmark runs in
a fresh Python process, one after another (run nothing else heavy meanwhile: the ratios are only as good as the
machine is quiet), its output shown as it comes. `--smoke` runs each at a tiny size (proof that it runs; its figures
mean nothing, and it never writes into benchmarks/results/). `--json OUT` writes what was measured, per benchmark:
the machine, the date, this command and the benchmark's own, its seconds, exit status and tables; the runs of the
benchmarks run now replace theirs in OUT, the others stay. A benchmark that needs what this machine lacks (a
module, a GPU) is left out, and the results say why. The device suite first makes a lent GPU machine ready
(`benchmarks/device_setup.py`); a benchmark that writes its own results as it goes gets a file beside OUT
(`OUT-stem.NAME.json`), and a GPU benchmark with a CPU smoke run runs that instead under `--smoke`.
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

from benchmarks.registry import BENCHMARKS, SUITES, Benchmark, select
from benchmarks.report import SINK, read_sink

HERE = Path(__file__).resolve().parent


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
    return smoke and benchmark.runs_on_cpu(has_cuda())


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
    if smoke:
        args = list(benchmark.cpu_smoke or ()) if on_cpu_instead(benchmark, smoke) else list(benchmark.smoke)
    else:
        args = list(benchmark.args)
    if repeats is not None and benchmark.takes_repeats:  # in place of the registry's own --repeats, if it has one
        while "--repeats" in args:
            at = args.index("--repeats")
            del args[at:at + 2]
        args += ["--repeats", str(repeats)]
    if json_file is not None and benchmark.writes_json:
        args += ["--json", str(json_file)]
    return [sys.executable, *benchmark.target, *args]


def run_one(benchmark: Benchmark, smoke: bool, repeats: int | None, env: dict[str, str],
            json_file: Path | None = None) -> dict[str, Any]:
    """Run `benchmark` in a fresh process (`python -m benchmarks.NAME`, from the repository's root), its output
    passed through; its record for the results."""
    record: dict[str, Any] = {"benchmark": benchmark.name, "suite": benchmark.suite, "about": benchmark.about,
                              "date": time.strftime("%Y-%m-%d %H:%M %Z")}
    reason = missing(benchmark, smoke)
    if reason is not None:
        print(f"\n== {benchmark.name}: left out ({reason})", flush=True)
        return {**record, "left_out": reason, "tables": []}
    if on_cpu_instead(benchmark, smoke):
        record["on_cpu"] = "no CUDA GPU here: the CPU smoke run (its figures mean nothing)"
    command = command_of(benchmark, smoke, repeats, json_file)
    shown = " ".join(command[1:])
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


def harness_command(argv: list[str]) -> str:
    """This command as typed from the repository's root (what a results file says measured its runs)."""
    shown = [os.path.relpath(a, HERE.parent) if os.path.isabs(a) and Path(a).is_relative_to(HERE.parent) else a
             for a in argv]
    return " ".join(["python -m benchmarks", *shown])


def earlier_runs(out: Path, smoke: bool, chosen: list[Benchmark]) -> list[dict[str, Any]]:
    """The runs of `out` that this run keeps: those of the benchmarks it does not run. A smoke run never writes
    into benchmarks/results/, nor into a file of real runs (nor a real run into a file of smoke runs)."""
    if smoke and out.resolve().parent == (HERE / "results").resolve():
        raise SystemExit(f"--smoke figures mean nothing: not into {out} (give a scratch path, e.g. /tmp/{out.name})")
    if not out.exists():
        return []
    earlier = json.loads(out.read_text(encoding="utf-8"))
    if bool(earlier.get("smoke")) != smoke:
        raise SystemExit(f"{out} holds {'smoke' if earlier.get('smoke') else 'real'} runs: a "
                         f"{'smoke' if smoke else 'real'} run does not mix with them (another --json path)")
    names = {b.name for b in chosen}
    top = {k: v for k, v in earlier.items() if k in ("date", "machine", "harness")}  # older files: once for all
    return [{**top, **r} for r in earlier.get("runs", []) if r["benchmark"] not in names]


def run(args: argparse.Namespace) -> int:
    chosen = select(args.suite)
    env = dict(os.environ)
    here = machine()
    kept = earlier_runs(Path(args.json), args.smoke, chosen) if args.json else []
    results: dict[str, Any] = {"smoke": args.smoke, "runs": kept}
    if any(b.suite == "device" for b in chosen):
        from benchmarks.device_setup import describe_gpu, prepare

        log = Path(tempfile.gettempdir()) / "fastdata-device-setup.txt"
        env = prepare(log)
        here["gpu"] = describe_gpu(env)
        print(f"GPU: {here['gpu']} (set-up log: {log})", flush=True)
    ran_now = []
    for benchmark in chosen:
        own = Path(args.json).with_name(f"{Path(args.json).stem}.{benchmark.name}.json") if args.json else None
        record = run_one(benchmark, args.smoke, args.repeats, env, own)
        ran_now.append({**record, "machine": here, "harness": harness_command(args.argv), "smoke": args.smoke})
        results["runs"] = kept + ran_now
        if args.json:  # written after each benchmark: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    failed = [r["benchmark"] for r in ran_now if r.get("exit", 0) != 0]
    left_out = [r["benchmark"] for r in ran_now if "left_out" in r]
    ran = len(ran_now) - len(failed) - len(left_out)
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
    import shutil

    from benchmarks.guard import HOW_TO_ADD, unguarded
    from benchmarks.provenance import Broken, Results
    from benchmarks.tables import DOCUMENTS, ROOT, check, update

    results = Results(Path(args.results)) if args.results else Results()
    documents = DOCUMENTS
    if args.render_to:  # copies of the documents, written from those results (the committed ones untouched)
        out = Path(args.render_to)
        documents = tuple(out / path.relative_to(ROOT) for path in DOCUMENTS)
        for source, copy in zip(DOCUMENTS, documents, strict=True):
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)
    if args.check:
        problems = check(documents, results, complete=args.complete)
        stray = [f"{path.relative_to(ROOT)}:{line}: a measured figure outside a marker: {context!r}"
                 for path in DOCUMENTS for line, context in unguarded(path)]
        for line in problems + stray:
            print(line)
        if stray:
            print(HOW_TO_ADD)
        return 1 if problems or stray else 0
    try:
        changed = update(documents, results)
    except Broken as exc:
        print(f"{exc}")
        return 1
    for path in changed:
        print(f"rewrote the figures of {path}")
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
    writer = commands.add_parser("tables", help="write the documents' figures from benchmarks/results/")
    writer.add_argument("--check", action="store_true", help="only say where they differ, and name any measured "
                        "figure written outside a marker (exit 1 if any)")
    writer.add_argument("--complete", action="store_true", help="with --check: a figure not measured yet fails too")
    writer.add_argument("--results", default=None, help="another results folder (default: benchmarks/results)")
    writer.add_argument("--render-to", default=None, help="write copies of the documents under this folder "
                        "instead of the documents themselves (to see what a scratch run's results would give)")
    writer.set_defaults(handler=tables)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
