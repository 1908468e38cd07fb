"""What `num_workers="auto"` / `prefetch_factor="auto"` mean: the stored result of `fastdata tune` for this dataset,
this machine and these loader options, or the default heuristic with a warning saying why.

A tune result is a small JSON file (no pickle), written atomically: `tune.json` inside the dataset's directory, or
`<tune_dir>/<dataset fingerprint>.json` in a user cache (default `~/.cache/fastdata/tune`) when the dataset's
directory cannot be written (a remote or read-only dataset) or a tune directory is asked for. One file holds one
entry per key: the dataset's content (its fingerprint), the machine (usable cores, the loader's GPU), and the
options that change what the best point is (batch size, augmentation, output size and dtype, device, world size).
An entry is reused only when every field of its key matches; otherwise the warning names the fields that differ.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fastdata._version import __version__
from fastdata.config import AUTO, available_cores
from fastdata.errors import ConfigError
from fastdata.formats.manifest import write_atomic
from fastdata.order.state import dataset_fingerprint

TUNE_FILE = "tune.json"  # beside the dataset's files (fastdata verify knows it)
TUNE_KIND, TUNE_VERSION = "fastdata.tune", 1
DECODES = ("worker", "device")


def default_tune_dir() -> Path:
    """Where tune results go when the dataset's own directory cannot hold them: `~/.cache/fastdata/tune`."""
    return Path.home() / ".cache" / "fastdata" / "tune"


def default_workers() -> int:
    """`num_workers=None`: one worker per usable core, at most 16."""
    return min(available_cores(), 16)


@dataclass(frozen=True)
class TuneKey:
    """What a tune result depends on: a stored result is reused only for an equal key."""

    dataset: str  # fastdata.order.state.dataset_fingerprint of the manifest
    cores: int  # usable cores of the machine (affinity / cpuset)
    device: str | None  # None (batches stay on the CPU), "cpu", or "cuda: <GPU name>"
    batch_size: int
    augment: str | None  # "train", "val", None (whole images) or "custom: <transform type>"
    image_size: list[int] | None  # the batches' (height, width) for the presets, None otherwise
    dtype: str  # "uint8" or the floating dtype the batches are made in
    world_size: int = 1

    def differences(self, other: TuneKey) -> list[str]:
        """One phrase per field that differs: `batch_size 128 (this loader: 256)`, `self` being the stored key."""
        return [f"{f.name} {getattr(self, f.name)} (this loader: {getattr(other, f.name)})" for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneKey:
        size = data.get("image_size")
        values: dict[str, Any] = {**{f.name: data.get(f.name) for f in fields(cls)},
                                  "image_size": list(size) if size is not None else None}
        return cls(**values)


@dataclass(frozen=True)
class Choice:
    """A measured point of the search: DataLoader workers, prefetch depth, where JPEGs are decoded, and what it
    gave (images/s through the step, the loop's share of time waiting for data)."""

    num_workers: int
    prefetch_factor: int
    decode: str = "worker"
    images_per_s: float = 0.0
    data_wait: float | None = None


@dataclass(frozen=True)
class TuneEntry:
    """One stored result: its key, the choice, the best point for each decode placement measured (so that a loader
    that fixes `decode` still finds its best), every point measured, and how the search ran."""

    key: TuneKey
    choice: Choice
    by_decode: dict[str, Choice]
    measured: list[Choice] = field(default_factory=list)
    step: str = "none"
    budget_s: float = 0.0
    seconds: float = 0.0
    created: str = ""
    version: str = __version__

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneEntry:
        return cls(key=TuneKey.from_dict(data["key"]), choice=Choice(**data["choice"]),
                   by_decode={k: Choice(**v) for k, v in data["by_decode"].items()},
                   measured=[Choice(**m) for m in data.get("measured", [])], step=str(data.get("step", "none")),
                   budget_s=float(data.get("budget_s", 0.0)), seconds=float(data.get("seconds", 0.0)),
                   created=str(data.get("created", "")), version=str(data.get("version", "")))


@dataclass(frozen=True)
class Tuned:
    """What a loader asked for with "auto" got (`loader.tuned`): the values, and where they came from: the
    tune file (`source`) or "default" with the `reason` no tune result applied."""

    num_workers: int
    prefetch_factor: int
    decode: str | None  # the decode placement the result chose (None: the loader's own `decode` stands)
    source: str  # the tune file's path, or "default"
    reason: str = ""
    entry: TuneEntry | None = None


def loader_key(data: Any, batch_size: int, augment: Any, dtype: Any, device: Any, world_size: int
               ) -> tuple[TuneKey | None, str]:
    """The key of a loader over `data` (an opened dataset) with these options, or (None, why no result can be
    stored for it). `device` is resolved here: a CUDA device is named by its GPU (CUDA starts on it)."""
    pipeline = getattr(data, "pipeline", None)
    if pipeline is None:
        return None, "fastdata tune measures image datasets; give a text loader its num_workers"
    if device is not None:
        import torch

        device = torch.device(device)
        if device.type == "cuda" and torch.cuda.is_available():
            device = f"cuda: {cuda_device_name(device)}"
        else:
            device = device.type
    if augment is not None and not isinstance(augment, str):
        augment = f"custom: {type(augment).__module__}.{type(augment).__qualname__}"
    size = pipeline.output_size
    return TuneKey(dataset=dataset_fingerprint(data.manifest), cores=available_cores(), device=device,
                   batch_size=int(batch_size), augment=augment, image_size=list(size) if size is not None else None,
                   dtype="uint8" if dtype is None else str(dtype), world_size=int(world_size)), ""


def cuda_device_name(device: Any) -> str:
    """The GPU's name, from NVML where it is installed, so that a loader made before its workers start does not
    start CUDA in this process (they fork later); from CUDA otherwise."""
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(device))
            name = pynvml.nvmlDeviceGetName(handle)
        finally:
            pynvml.nvmlShutdown()
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML, or a device it does not map: CUDA knows
        return torch.cuda.get_device_name(device)


def dataset_root(data: Any) -> Path | None:
    """The local directory of an opened dataset (None for a remote one, whose results go to the user cache)."""
    root = getattr(data, "root", None)
    if root is None or "://" in str(root):
        return None
    return Path(root)


def tune_files(root: Path | None, fingerprint: str, tune_dir: str | os.PathLike[str] | None) -> list[Path]:
    """Where results for a dataset may be, in the order they are read: beside its files, then the user cache."""
    cache = Path(tune_dir) if tune_dir is not None else default_tune_dir()
    beside = [root / TUNE_FILE] if root is not None else []
    return [*beside, cache / f"{fingerprint}.json"]


def read_entries(path: Path) -> list[TuneEntry]:
    """The entries of one tune file ([] when there is none); ConfigError naming the file when it is damaged."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read this tune result ({exc.strerror}); delete it or run `fastdata "
                          "tune` again") from exc
    try:
        data = json.loads(text)
        if data.get("kind") != TUNE_KIND:
            raise ValueError(f"kind is {data.get('kind')!r}, not {TUNE_KIND!r}")
        if data.get("version") != TUNE_VERSION:
            raise ValueError(f"version {data.get('version')!r}, this fastdata reads {TUNE_VERSION}")
        return [TuneEntry.from_dict(entry) for entry in data["entries"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a fastdata tune result ({exc}); delete it and run `fastdata tune` "
                          "again") from exc


def write_entry(path: Path, entry: TuneEntry) -> Path:
    """Add `entry` to the tune file `path` (replacing the entry of the same key), atomically; returns `path`."""
    kept = [e for e in read_entries(path) if e.key != entry.key]
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"kind": TUNE_KIND, "version": TUNE_VERSION, "dataset": entry.key.dataset,
            "entries": [e.to_dict() for e in [*kept, entry]]}
    write_atomic(path, (json.dumps(data, indent=1) + "\n").encode())
    return path


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def find_entry(key: TuneKey, files: list[Path]) -> tuple[TuneEntry | None, Path | None, str]:
    """The newest entry of `files` whose key equals `key`, the file it is in, and otherwise why there is none
    (the nearest stored key's differences, or that nothing is stored)."""
    found: list[tuple[TuneEntry, Path]] = [(e, path) for path in files for e in read_entries(path)]
    matching = [(e, path) for e, path in found if e.key == key]
    if matching:
        entry, path = max(matching, key=lambda pair: pair[0].created)
        return entry, path, ""
    if not found:
        return None, None, f"nothing stored in {' or '.join(str(p) for p in files)}"
    nearest = min((e.key.differences(key) for e, _ in found), key=len)
    return None, None, "the stored results differ: " + "; ".join(nearest)


def resolve_auto(key: TuneKey | None, files: list[Path], num_workers: Any, prefetch_factor: Any, decode: str,
                 dataset: str, not_tunable: str = "") -> Tuned:
    """num_workers / prefetch_factor for a loader that asked for "auto" (either or both): the stored result's
    point for `key`, respecting a `decode` the loader fixed ("worker" / "device"); when none applies, the default
    heuristic (one worker per core, at most 16; prefetch 2) with one warning per process and reason, naming it and
    the command that measures it. `not_tunable` says why no key can exist for this loader (e.g. a text dataset)."""
    entry, path, reason = (None, None, not_tunable) if key is None else find_entry(key, files)
    point: Choice | None = None
    if entry is not None:
        point = entry.choice if decode == "auto" else entry.by_decode.get(decode)
        if point is None:
            reason = f"the stored result measured decode={', '.join(entry.by_decode)}, this loader has {decode!r}"
    if point is None or entry is None:
        workers = default_workers() if num_workers in (AUTO, None) else int(num_workers)
        prefetch = 2 if prefetch_factor == AUTO else int(prefetch_factor)
        _warn_untuned(f"{dataset}: no tune result for this dataset, machine and loader options ({reason}); using "
                      f"num_workers={workers}, prefetch_factor={prefetch}: {tune_command(dataset, key)}")
        return Tuned(workers, prefetch, None, "default", reason)
    workers = point.num_workers if num_workers == AUTO else (default_workers() if num_workers is None
                                                             else int(num_workers))
    prefetch = point.prefetch_factor if prefetch_factor == AUTO else int(prefetch_factor)
    return Tuned(workers, prefetch, point.decode if decode == "auto" else None, str(path), "", entry)


def measured_decode(key: TuneKey | None, files: list[Path], num_workers: int | None = None) -> str | None:
    """`decode="auto"` without `num_workers="auto"`: the placement `fastdata tune` measured fastest for `key`
    (this dataset, machine, GPU and loader options) with the loader's `num_workers` (None: the default count,
    `default_workers`; see `placement_for`), or None when nothing was measured (then "auto" decodes in the
    workers). Quiet: the defaults need no tune result."""
    if key is None or key.device is None or not key.device.startswith("cuda"):
        return None
    try:
        entry, _, _ = find_entry(key, files)
    except ConfigError:  # a damaged tune file: "auto" stays with the workers; `fastdata tune` rewrites it
        return None
    return placement_for(entry, default_workers() if num_workers is None else num_workers) if entry else None


def placement_for(entry: TuneEntry, num_workers: int) -> str:
    """The decode placement of `entry` for a loader with `num_workers` workers. The entry's choice was made at its
    own worker count, and the placements need different counts (the device path's workers only ship bytes): with
    2 workers, decoding in them may be far slower than the device path that tune chose at 16 workers as a tie, or
    the other way round. So each placement is rated by its best point measured with at most `num_workers` workers
    (what it reaches with that many: tune climbs each placement from 1 worker up) and the faster one is taken;
    the entry's choice where a placement has no such point or they are equal."""
    rates: dict[str, float] = {}
    for point in entry.measured:
        if point.num_workers <= num_workers and point.decode in DECODES:
            rates[point.decode] = max(rates.get(point.decode, 0.0), point.images_per_s)
    if len(rates) < len(DECODES) or len(set(rates.values())) == 1:
        return entry.choice.decode
    return max(rates, key=lambda decode: rates[decode])


def tune_command(dataset: str, key: TuneKey | None) -> str:
    """What to run to measure a result for `key`: the `fastdata tune` command with the loader's options, or why
    the command cannot measure this loader."""
    if key is None:
        return "pass num_workers and prefetch_factor as numbers"
    if key.augment not in ("train", "val"):
        return "fastdata tune measures augment='train' or 'val'; pass num_workers and prefetch_factor as numbers"
    if key.world_size != 1:
        return ("fastdata tune measures one process; with several ranks per machine pass num_workers and "
                "prefetch_factor as numbers")
    flags = [f"--batch-size {key.batch_size}"]
    if key.augment != "train":
        flags.append(f"--augment {key.augment}")
    if key.image_size is not None:
        height, width = key.image_size
        flags.append(f"--image-size {height}" if height == width else f"(image size {height}x{width})")
    if key.dtype != "uint8":
        flags.append(f"--dtype {key.dtype.removeprefix('torch.')}")
    if key.device is not None:
        flags.append(f"--device {key.device.split(':')[0]}")
    return f"run `fastdata tune {dataset} {' '.join(flags)}` to measure them"


@functools.cache
def _warn_untuned(message: str) -> None:
    """Say once per process (and message) that "auto" fell back to the default heuristic."""
    warnings.warn(message, RuntimeWarning, stacklevel=6)  # the caller of fastdata.loader (via its resolve step)
