"""`fastdata` command line: convert | info | verify | bench | tune | doctor | demo.

Every error a user can cause prints as one line, `error: <what is wrong and what to do>`, exit code 2 (1 for
rejections: --strict, or more than --max-rejected), never a traceback; Ctrl-C prints one line, exit code 130. Heavy
modules (torch, the converters) are imported by the command that needs them, so `--version` and `--help` answer at
once.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import click

from fastdata._version import __version__
from fastdata.converters import REGISTRY, SUMMARIES
from fastdata.errors import FastdataError, MostlyRejectedWarning, RejectedFileError, TooManyRejectedError
from fastdata.interrupts import CtrlC

#: exit codes
USAGE_ERROR, INTERRUPTED = 2, 130
#: `fastdata` alone prints the help (click >= 8.2 raises this for it; older click prints it itself)
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _Interrupted(Exception):
    """Ctrl-C, caught where the command ran (before click turns it into a bare Abort), with what to do next."""

    def __init__(self, hint: str = "") -> None:
        super().__init__(hint)
        self.hint = hint


class _Cli(click.Group):
    """The root group: lists every convert subcommand in `fastdata --help` (from the converter registry, without
    importing the converters) and turns Ctrl-C into `_Interrupted`."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        entries: list[tuple[str, click.Command | str]] = []
        for name in self.list_commands(ctx):
            if name == "convert":
                entries += [(f"convert {kind}", SUMMARIES[kind]) for kind in sorted(REGISTRY)]
            elif (command := self.get_command(ctx, name)) is not None and not command.hidden:
                entries.append((name, command))
        limit = formatter.width - 6 - max(len(name) for name, _ in entries)  # as click's own listing
        with formatter.section("Commands"):
            formatter.write_dl([(name, what if isinstance(what, str) else what.get_short_help_str(limit))
                                for name, what in entries])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise _Interrupted(exc.args[0] if exc.args and isinstance(exc.args[0], str) else "") from None


class _ConvertGroup(click.Group):
    """`fastdata convert <kind>`: one subcommand per registered converter, imported on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(REGISTRY)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        from fastdata.converters import load

        if name not in REGISTRY:
            return None
        command = load(name).cli_command()
        command.short_help = SUMMARIES[name]
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(kind, SUMMARIES[kind]) for kind in sorted(REGISTRY)])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with warnings.catch_warnings():  # the summary's first line says it: not a second time as a note
                warnings.simplefilter("ignore", MostlyRejectedWarning)
                return super().invoke(ctx)
        except KeyboardInterrupt as exc:  # a conversion says how far it had come (`Staging.owned`); before it
            if exc.args:                  # took its output, nothing was written
                raise
            from fastdata.convert.staging import NOT_STARTED_HINT

            raise KeyboardInterrupt(NOT_STARTED_HINT) from None


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fastdata")
def cli() -> None:
    """fastdata: pack image and text datasets into LMDB / WebDataset and load them at full speed.

    \b
    fastdata convert imagefolder train/ train.lmdb     # pack an ImageFolder tree
    fastdata convert text corpus/ corpus.lmdb --tokenizer tokenizer.json
    fastdata info train.lmdb                           # what is inside
    fastdata bench train.lmdb --baseline-imagefolder train/
    fastdata tune train.lmdb --step 120ms              # best num_workers / prefetch, for "auto"
    fastdata doctor train.lmdb                         # check the machine and the data
    fastdata demo                                      # all of it on a built-in sample
    """


@cli.group(cls=_ConvertGroup)
def convert() -> None:
    """Convert a source dataset into a fastdata dataset (LMDB or WebDataset shards)."""


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--scan-gpu", is_flag=True,
              help="For an image dataset converted before its conversion counted them: read each stored image's "
                   "header to count the JPEGs the GPU's hardware JPEG engines take (baseline), the progressive ones "
                   "and the rest.")
def info(path: Path, scan_gpu: bool) -> None:
    """Show what the dataset at PATH holds: kind, format, counts, classes, bytes, options, how many stored images
    the GPU's JPEG engines take, files."""
    from fastdata.tools.info import describe

    click.echo(describe(path, scan_gpu=scan_gpu))


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--source", type=click.Path(path_type=Path), default=None, metavar="SRC",
              help="Also check the dataset against the source it was converted from: an image dataset's samples "
                   "and labels against its ImageFolder tree, file list, HF dataset, shards or COCO files; a text "
                   "dataset's source files by name and size.")
@click.option("--decode", is_flag=True, help="Also decode every image.")
def verify(path: Path, source: Path | None, decode: bool) -> None:
    """Check the dataset at PATH against its manifest (files, sizes, sha256, counts, labels); exit 1 if
    anything is wrong, naming every problem."""
    from fastdata.tools.verify import verify as run_verify

    report = run_verify(path, source=source, decode=decode)
    click.echo(str(report))
    if not report.ok:
        raise click.exceptions.Exit(1)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--baseline-imagefolder", type=click.Path(path_type=Path), default=None, metavar="SRC",
              help="Also run torchvision ImageFolder + DataLoader (same transform and DataLoader settings) and "
                   "print the ratio. SRC is the tree PATH was converted from; the files the conversion rejected "
                   "are left out. If PATH was re-encoded at conversion (--max-size), the baseline reads an "
                   "ImageFolder exported from PATH instead: the same stored bytes.")
@click.option("--baseline-list", type=click.Path(path_type=Path), default=None, metavar="LIST",
              help="For a dataset converted from a file list (convert list): the baseline is a torchvision Dataset "
                   "over the images LIST names (same transform, PIL decode), less the rejected ones.")
@click.option("--baseline-export", is_flag=True,
              help="For a dataset whose source is not files torchvision reads (convert hf, convert webdataset): the "
                   "baseline is a torchvision Dataset over PATH's stored bytes exported as files (same transform, "
                   "PIL decode), into --export-dir or a temporary directory.")
@click.option("--baseline-source", is_flag=True,
              help="With a re-encoded PATH: time the baseline on SRC's original files anyway (marked "
                   "'different inputs').")
@click.option("--export-dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Where to export a re-encoded dataset's stored bytes for the baseline, kept and reused "
                   "(default: a temporary directory, removed afterwards).")
@click.option("--epochs", default=2, show_default=True, help="Timed passes over the data per run.")
@click.option("--warmup-passes", default=1, show_default=True,
              help="Untimed passes over each freshly built loader before the timed ones (every loader alike); "
                   "0 times everything from building the loader on.")
@click.option("--page-cache", type=click.Choice(["warm", "cold"]), default="warm", show_default=True,
              help="warm: read every loader's files once before timing; cold: evict each loader's files from "
                   "the page cache before each timed run (posix_fadvise).")
@click.option("--batch-size", default=128, show_default=True)
@click.option("--image-size", default=224, show_default=True)
@click.option("--augment", type=click.Choice(["train", "val"]), default="train", show_default=True)
@click.option("--workers", type=int, default=None, help="Loader workers (every loader). Default: all cores.")
@click.option("--repeats", default=3, show_default=True,
              help="Runs of each loader, alternating; figures are medians, ratios medians of per-run ratios.")
@click.option("--step", type=click.Choice(["to-device", "none"]), default="to-device", show_default=True,
              help="What the loop does with each batch: copy it to the GPU (CPU without one) and make float "
                   "images there, as a training step starts; or nothing (pure loader speed).")
@click.option("--upper-bound/--no-upper-bound", default=True, show_default=True,
              help="Also run the synthetic upper bound: fastdata's batches again from memory, same step.")
@click.option("--plot", "plot", type=click.Path(path_type=Path), default=None, metavar="PATH.png",
              help="Draw throughput and data wait over time for every loader, side by side (needs matplotlib).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, metavar="PATH",
              help="Write every figure (runs, timelines, system figures) as JSON.")
@click.option("--trace", "trace_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Write a Chrome / Perfetto trace of every loader's timed passes into DIR, one per loader and run "
                   "(open in ui.perfetto.dev: data wait and compute per step, worker spans, system counters).")
def bench(path: Path, baseline_imagefolder: Path | None, baseline_list: Path | None, baseline_export: bool,
          baseline_source: bool, export_dir: Path | None,
          epochs: int, warmup_passes: int, page_cache: str, batch_size: int, image_size: int, augment: str,
          workers: int | None, repeats: int, step: str, upper_bound: bool, plot: Path | None,
          json_path: Path | None, trace_dir: Path | None) -> None:
    """Measure the loader's throughput over the dataset at PATH (images/s, MB/s, time to first batch, data
    wait), against the ImageFolder baseline and the synthetic upper bound, in one run. Every loader gets
    fastdata.loader's DataLoader settings, the same warm-up and the same page-cache treatment."""
    from fastdata.errors import ConfigError
    from fastdata.tools.bench import BenchConfig, busy_machine_note, format_summary, format_table, run_bench
    from fastdata.tools.bench_report import check_plotting, plot_runs, write_json

    if plot is not None:
        check_plotting()  # before the runs, not after
    from_source = baseline_imagefolder is not None or baseline_list is not None
    if (baseline_source and not from_source) or (export_dir is not None and not (from_source or baseline_export)):
        raise ConfigError("--baseline-source and --export-dir apply to --baseline-imagefolder SRC or --baseline-list "
                          "LIST (--export-dir also to --baseline-export)")
    config = BenchConfig(epochs=epochs, batch_size=batch_size, image_size=image_size, augment=augment,
                         workers=workers, repeats=repeats, step=step, warmup_passes=warmup_passes,
                         page_cache=page_cache)
    results = run_bench(path, config, baseline_imagefolder=baseline_imagefolder,
                        progress=lambda line: click.echo(line, err=True), upper_bound=upper_bound,
                        baseline_source=baseline_source, export_dir=export_dir, baseline_list=baseline_list,
                        baseline_export=baseline_export, trace_dir=trace_dir)
    click.echo(format_table(results, data_wait=step != "none"))
    busy = busy_machine_note(results)
    if busy:
        click.echo(busy)
    summary = format_summary(results)
    if summary:
        click.echo("\n" + summary)
    if json_path is not None:
        click.echo(f"figures: {write_json(json_path, results, config, path, baseline_imagefolder or baseline_list)}",
                   err=True)
    if trace_dir is not None:
        click.echo(f"traces: {trace_dir} (open each in ui.perfetto.dev or chrome://tracing)", err=True)
    if plot is not None:
        shown = f"{config.num_workers} worker{'s' * (config.num_workers != 1)}"
        title = f"fastdata bench {path.name}: batch {batch_size}, {shown}, step {step}"
        click.echo(f"plot: {plot_runs(plot, results, title)}", err=True)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--step", default="none", show_default=True, metavar="STEP",
              help="What the loop does with each batch while measuring: none, to-device, a step time such as "
                   "50ms (the host waits, as while the GPU runs a step), or a torchvision model name such as "
                   "resnet18 (a real training step, on the GPU when there is one). Give your own step's time: "
                   "the best settings depend on it.")
@click.option("--batch-size", default=256, show_default=True, help="As the loader will have it.")
@click.option("--augment", type=click.Choice(["train", "val"]), default="train", show_default=True)
@click.option("--image-size", type=int, default=None, help="As the loader will have it (default: the loader's).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Normalised float batches, as the loader's output=OutputOptions(dtype=...) (default: uint8).")
@click.option("--device", default=None, metavar="DEVICE",
              help="Batches arrive on DEVICE (e.g. cuda), as the loader's device=; with CUDA and nvjpeg, decoding "
                   "on the GPU is measured too.")
@click.option("--budget", default=60.0, show_default=True, help="Seconds the search may take (points that would "
              "not fit are not started).")
@click.option("--window", default=3.0, show_default=True, help="Measured seconds per point, after its warm-up.")
@click.option("--max-workers", type=int, default=None,
              help="Most workers tried (default: one more than the usable cores, at most 16).")
@click.option("--tune-dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Keep the result in DIR (give the loader tune_dir=DIR). Default: tune.json in the dataset's "
                   "directory, or ~/.cache/fastdata/tune when that cannot be written.")
def tune(path: Path, step: str, batch_size: int, augment: str, image_size: int | None, dtype: str | None,
         device: str | None, budget: float, window: float, max_workers: int | None, tune_dir: Path | None) -> None:
    """Find the loader's best num_workers and prefetch_factor (and decode placement with a CUDA device) for the
    dataset at PATH on this machine, in a short bounded search; print the table and the choice, and keep it for
    fastdata.loader(..., num_workers="auto", prefetch_factor="auto")."""
    from fastdata.tools.tune import TuneConfig, format_result, run_tune

    torch_dtype = None
    if dtype is not None:
        import torch

        torch_dtype = getattr(torch, dtype)
    config = TuneConfig(batch_size=batch_size, augment=augment, image_size=image_size, dtype=torch_dtype,
                        device=device, step=step, budget_s=budget, window_s=window, max_workers=max_workers)
    result = run_tune(path, config, tune_dir=tune_dir, progress=lambda line: click.echo(line, err=True))
    click.echo(format_result(path, result, config))


@cli.command()
@click.argument("path", type=click.Path(path_type=Path), required=False)
def doctor(path: Path | None) -> None:
    """Check this machine before a long job (and the storage and dataset at PATH): torch / CUDA / driver /
    GPU capability, cores and num_workers, RAM, /dev/shm, open files, pinned memory. Exit 1 if a check FAILs."""
    from fastdata.tools.doctor import run_checks
    from fastdata.tools.doctor.table import exit_code, format_checks

    checks = run_checks(path)
    click.echo(format_checks(checks))
    if exit_code(checks):
        raise click.exceptions.Exit(1)


@cli.command()
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=Path("fastdata-demo"),
              show_default=True, help="Where the sample, the dataset and the results go.")
@click.option("--images", default=1200, show_default=True, help="Images in the generated sample.")
@click.option("--epochs", default=2, show_default=True)
def demo(directory: Path, images: int, epochs: int) -> None:
    """Make a sample ImageFolder of photos, convert it to LMDB and benchmark fastdata.loader against a
    torchvision ImageFolder DataLoader on it."""
    from fastdata.tools.demo import run_demo

    run_demo(directory, images=images, epochs=epochs, echo=click.echo)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fastdata` console script: runs the command, and prints any error it raises as one
    line (`error: ...`) with its exit code instead of a traceback."""
    # a file name that is not UTF-8 (held as lone surrogates, PEP 383) never makes a print fail: on stdout it is
    # written as its own bytes (as `ls` does), in messages on stderr as \udcNN escapes
    for stream, errors in ((sys.stdout, "surrogateescape"), (sys.stderr, "backslashreplace")):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=errors)
    _one_blas_thread()
    with CtrlC() as ctrl_c, warnings.catch_warnings():
        warnings.showwarning = _note
        try:
            code = _run(argv)
        except (_Interrupted, KeyboardInterrupt, click.exceptions.Abort) as exc:
            return _interrupted(exc.hint if isinstance(exc, _Interrupted) else "")
        except Exception:
            if not ctrl_c.received:
                raise
            return _interrupted("")  # an error an importer made of a Ctrl-C it swallowed: the Ctrl-C is the news
    return _interrupted("") if ctrl_c.held else code


def _note(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
          line: str | None = None) -> None:
    """A warning, as the command line's own one-line note on stderr (not Python's "path:line: UserWarning" and
    the source line): what it says is for the user of the command, not for the code's author."""
    click.echo(f"note: {str(message).strip()}", err=True)


def _one_blas_thread() -> None:
    """Keep numpy's OpenBLAS to one thread unless the user chose otherwise: at import it starts a thread per core
    that spins ~0.1 s of CPU, a core's worth taken from the conversion workers on a small machine, and no command
    does linear algebra in numpy (torch has its own)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _interrupted(hint: str) -> int:
    click.echo(f"interrupted; {hint}" if hint else "interrupted", err=True)
    return INTERRUPTED


def _run(argv: list[str] | None) -> int:
    """Run the command: its exit code, after printing any error a user can cause as one line."""
    try:
        code = cli.main(args=argv, prog_name="fastdata", standalone_mode=False)
    except _NO_ARGS_IS_HELP as exc:
        exc.show()  # `fastdata` alone: the help
        return exc.exit_code
    except click.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        click.echo(f"error: {_one_line(exc.format_message())}{where}", err=True)
        return USAGE_ERROR
    except click.ClickException as exc:
        click.echo(f"error: {_one_line(exc.format_message())}", err=True)
        return exc.exit_code
    except FastdataError as exc:
        click.echo(f"error: {_one_line(exc)}", err=True)
        return 1 if isinstance(exc, (RejectedFileError, TooManyRejectedError)) else USAGE_ERROR
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
