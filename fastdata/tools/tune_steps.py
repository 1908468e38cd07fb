"""What `fastdata tune --step` does with each batch while the loader is measured: the best loader settings depend
on how long the training step leaves the loader to work, so the tuner is given one.

- "none": nothing (pure loader speed: more workers help until the CPU is full);
- "to-device": copy the batch to the GPU (the CPU without one) and make float images there;
- "<N>ms" (or a bare number of milliseconds): the host sleeps N ms per batch, as it waits while the GPU runs a
  step: the workers have the CPU to themselves meanwhile;
- a torchvision model name ("resnet18", "resnet50", ...): a real forward + backward + SGD step of that model (random
  weights) on the GPU in bfloat16 autocast (the CPU in float32 without one).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastdata.errors import ConfigError

STEP_HELP = "none, to-device, a step time such as 50ms, or a torchvision model name such as resnet18"


@dataclass
class Step:
    """A training step stand-in: `work(images, labels)` per batch, `finish()` before the clock is read (waits for
    queued GPU work), and `name` as given."""

    name: str
    work: Callable[[Any, Any], Any] | None = None
    finish: Callable[[], None] | None = None

    def __call__(self, images: Any, labels: Any) -> None:
        if self.work is not None:
            self.work(images, labels)

    def done(self) -> None:
        if self.finish is not None:
            self.finish()


def parse_step(spec: str) -> Step:
    """The step `spec` names (see the module's docstring); ConfigError naming what is accepted otherwise."""
    text = str(spec).strip()
    if text in ("", "none"):
        return Step("none")
    if text == "to-device":
        return _to_device()
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(ms)?", text)
    if match:
        seconds = float(match.group(1)) / 1000
        return Step(f"{float(match.group(1)):g}ms", lambda _images, _labels: time.sleep(seconds))
    if re.fullmatch(r"[a-z][a-z0-9_]*", text):
        return _model_step(text)
    raise ConfigError(f"step must be {STEP_HELP}; got {spec!r}")


def _device() -> Any:
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _to_device() -> Step:
    import torch

    device = _device()
    finish = None
    if device.type == "cuda":
        torch.zeros(1, device=device).add_(1)  # start CUDA now, outside the timing
        finish = torch.cuda.synchronize

    def work(images: Any, _labels: Any) -> Any:
        return images.to(device, non_blocking=True).float().div_(255)

    return Step("to-device", work, finish)


def _model_step(name: str) -> Step:
    """forward + backward + SGD of torchvision model `name` (random weights, 1000 classes) per batch."""
    import torch

    try:
        from torchvision.models import get_model, list_models
    except ImportError as exc:
        raise ConfigError(f"--step {name} needs torchvision (pip install torchvision); or give a step time such "
                          "as 50ms") from exc
    if name not in list_models():
        raise ConfigError(f"step must be {STEP_HELP}; {name!r} is not a torchvision model")
    device = _device()
    model = get_model(name, weights=None, num_classes=1000).to(device)
    cuda = device.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def work(images: Any, labels: Any) -> None:
        x = images.to(device, non_blocking=True)
        x = x.float().div_(255) if not x.is_floating_point() else x.float()
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        target = (labels.to(device, non_blocking=True).long() % 1000 if isinstance(labels, torch.Tensor)
                  and labels.ndim == 1 else torch.zeros(len(x), dtype=torch.long, device=device))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = loss_fn(model(x), target)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    return Step(name, work, torch.cuda.synchronize if cuda else None)
