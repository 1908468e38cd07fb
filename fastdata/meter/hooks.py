"""Ready-made `on_log` callbacks for `fastdata.meter(..., log_every=N, on_log=...)`: the meter's figures into a
TensorBoard `SummaryWriter` or a Lightning logger, so the input pipeline's health is charted beside the loss.

Each callback receives the figures as a dict (`step`, `seconds`, `steps_per_s`, `samples_per_s`,
`data_wait_fraction`, and the system figures sampled last: `cpu_percent`, `iowait_percent`, `gpu_util_percent`,
`rss_mb`, ...; a figure that could not be had is left out) and logs every number but `step` under
`prefix` + its name, at that step. Neither library is imported here: the writer or logger is built by the caller
(`pip install fastdata[tensorboard]` for SummaryWriter's `tensorboard` package, `fastdata[lightning]`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PREFIX = "fastdata/"


def scalars(figures: dict[str, Any], prefix: str = PREFIX) -> dict[str, float]:
    """The numeric figures but `step`, named `prefix` + name."""
    return {prefix + name: float(value) for name, value in figures.items()
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


def tensorboard(writer: Any, prefix: str = PREFIX) -> Callable[[dict[str, Any]], None]:
    """An `on_log` callback writing each figure with `writer.add_scalar(prefix + name, value, step)`.

    Args:
        writer: a `torch.utils.tensorboard.SummaryWriter` (or anything with its `add_scalar`).
        prefix: put before each figure's name (its TensorBoard tag).
    """
    if not callable(getattr(writer, "add_scalar", None)):
        raise TypeError(f"tensorboard() needs a torch.utils.tensorboard.SummaryWriter (something with add_scalar), "
                        f"got {type(writer).__name__}")

    def log(figures: dict[str, Any]) -> None:
        step = int(figures["step"])
        for name, value in scalars(figures, prefix).items():
            writer.add_scalar(name, value, step)

    return log


def lightning(logger: Any, prefix: str = PREFIX) -> Callable[[dict[str, Any]], None]:
    """An `on_log` callback calling `logger.log_metrics({prefix + name: value, ...}, step)`.

    Args:
        logger: a Lightning logger (`lightning.pytorch.loggers.CSVLogger`, `TensorBoardLogger`, `WandbLogger`...,
            e.g. `trainer.logger`).
        prefix: put before each figure's name (its metric name).
    """
    if not callable(getattr(logger, "log_metrics", None)):
        raise TypeError(f"lightning() needs a Lightning logger (something with log_metrics), got "
                        f"{type(logger).__name__}")

    def log(figures: dict[str, Any]) -> None:
        logger.log_metrics(scalars(figures, prefix), step=int(figures["step"]))

    return log
