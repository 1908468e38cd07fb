"""What `fastdata bench` writes besides its table: the raw figures as JSON (`--json`) and a plot of
throughput and data wait over time for each loader, side by side (`--plot`, needs matplotlib)."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastdata.config import available_cores
from fastdata.errors import ConfigError
from fastdata.tools.bench import BenchConfig, LoaderResult


def bench_dict(results: list[LoaderResult], config: BenchConfig, dataset: str | os.PathLike[str] | None = None,
               baseline: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Every figure of a bench run as plain JSON types."""
    base = next((r for r in results if r.role == "baseline"), results[0] if results else None)
    upper = next((r for r in results if r.role == "upper-bound"), None)
    loaders = []
    for r in results:
        loaders.append({
            "name": r.name, "role": r.role, "images_per_s": r.images_per_s, "mb_per_s": r.mb_per_s,
            "first_batch_s": r.first_batch_s, "data_wait_fraction": r.data_wait_fraction,
            "vs_baseline": r.ratio_to(base) if base else None,  # medians of the per-run ratios
            "of_upper_bound": r.ratio_to(upper) if upper else None,
            "inputs": r.inputs, "notes": r.notes, "different_inputs": r.different_inputs,
            "runs": [{**asdict(run), "images_per_s": run.images_per_s, "mb_per_s": run.mb_per_s} for run in r.runs],
        })
    return {"config": {**asdict(config), "num_workers": config.num_workers, "settings": asdict(config.settings)},
            "dataset": None if dataset is None else str(dataset),
            "baseline_imagefolder": None if baseline is None else str(baseline),
            "machine": _machine(), "loaders": loaders}


def write_json(path: str | os.PathLike[str], results: list[LoaderResult], config: BenchConfig,
               dataset: str | os.PathLike[str] | None = None,
               baseline: str | os.PathLike[str] | None = None) -> Path:
    """Write `bench_dict(...)` to `path` (parent folders made as needed)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(bench_dict(results, config, dataset, baseline), indent=1) + "\n")
    return out


def check_plotting() -> None:
    """Raise ConfigError naming the fix when matplotlib is missing (called before a long bench starts)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'fastdata[plot]'") from exc


def smooth(timeline: dict[str, Any], points: int, min_steps: float = 4.0) -> dict[str, Any]:
    """A meter timeline made readable: merged into at most `points` bins, then each point the mean over a
    centred window of bins holding about `min_steps` steps (short runs have about one batch per bin)."""
    timeline = coarsen(timeline, points)
    steps = timeline.get("steps_per_s", [])
    if not steps:
        return timeline
    bin_s = timeline.get("bin_s") or 0.0
    per_bin = sum(steps) * bin_s / len(steps) if bin_s else 0.0
    half = int(min_steps / per_bin) // 2 if per_bin > 0 else 0
    if half < 1:
        return timeline

    def rolling(values: list[float]) -> list[float]:
        out = []
        for i in range(len(values)):
            window = values[max(0, i - half):i + half + 1]
            out.append(sum(window) / len(window))
        return out

    return {**timeline, **{key: rolling(timeline[key]) for key in ("samples_per_s", "steps_per_s",
                                                                   "data_wait_fraction")}}


def coarsen(timeline: dict[str, Any], points: int) -> dict[str, Any]:
    """A meter timeline merged into at most `points` bins (averages of neighbours), for a readable plot."""
    t = timeline.get("t", [])
    group = max(1, -(-len(t) // max(1, points)))
    if group == 1:
        return timeline

    def mean(values: list[float]) -> list[float]:
        return [sum(values[i:i + group]) / len(values[i:i + group]) for i in range(0, len(values), group)]

    return {**timeline, "bin_s": timeline.get("bin_s", 0) * group,
            **{key: mean(timeline[key]) for key in ("t", "samples_per_s", "steps_per_s", "data_wait_fraction")}}


def plot_runs(path: str | os.PathLike[str], results: list[LoaderResult], title: str = "", points: int = 60) -> Path:
    """Throughput (left) and data wait (right) over time of each loader's median run, as a PNG at `path`
    (each line at most `points` points, each a mean over about four steps)."""
    check_plotting()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    speed, wait = figure.subplots(1, 2)
    for r in results:
        timeline = smooth(r.median_run.timeline or {}, points)
        t = timeline.get("t", [])
        if not t:
            continue
        label = f"{r.name} ({r.images_per_s:,.0f} images/s)"
        style = "--" if r.role == "upper-bound" else "-"
        speed.plot(t, timeline["samples_per_s"], style, label=label, linewidth=1.6, marker=".")
        wait.plot(t, [100 * f for f in timeline["data_wait_fraction"]], style, label=r.name, linewidth=1.6,
                  marker=".")
    speed.set_title("throughput")
    speed.set_xlabel("seconds since the first batch was asked for")
    speed.set_ylabel("images/s")
    speed.set_ylim(bottom=0)
    speed.grid(alpha=0.3)
    speed.legend(fontsize="small", loc="best")
    wait.set_title("data wait (share of the loop's time waiting for the next batch)")
    wait.set_xlabel("seconds since the first batch was asked for")
    wait.set_ylabel("data wait %")
    wait.set_ylim(0, 102)
    wait.grid(alpha=0.3)
    wait.legend(fontsize="small", loc="best")
    if title:
        figure.suptitle(title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    return out


def _machine() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cores": available_cores(), "python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu}
