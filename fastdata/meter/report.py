"""The meter's report: figures, a verdict, the reasons behind it (with their numbers) and what to try.

`diagnose()` is a pure function of the measured figures, so each bottleneck it can name is tested with
figures made up for the purpose."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from fastdata.config import available_cores
from fastdata.meter.ranks import ranks_line
from fastdata.meter.stages import STAGES, StageTimes

INPUT_BOUND_AT = 0.30  # data wait fraction from which the loop is input-bound
COMPUTE_BOUND_BELOW = 0.10  # ... and below which it is compute-bound (balanced in between)
SATURATED_AT = 85.0  # CPU busy percent from which the machine has no core to spare
CONTENDED_SHARE = 0.25  # other processes' share of the machine's cores from which they slow a saturated job
BUSY_SHARE = 0.10  # ... from which a timed figure is said to come from a busy machine (`fastdata bench`, the demo)
MAIN_WALL_CORES = 0.85  # the training process's cores from which it is the wall (one Python thread at work) ...
IDLE_WORKERS_SHARE = 0.3  # ... while its workers use less than this share of a core each
# the share of progressive JPEGs from which a decode-bound worker-path loader is told of `--jpeg-layout baseline`
# (a progressive file cost a worker 2.13 ms, its baseline rewrite 0.73: benchmarks/baseline_layout.py)
PROGRESSIVE_WORTH_REWRITING = 0.01
VERDICTS = ("input-bound", "compute-bound", "cpu-contended", "balanced", "no steps measured", "too few steps")
NO_STEPS = "no steps measured"
TOO_FEW_STEPS = "too few steps"
#: The longer side `--max-size` advice re-converts to, given only where some stored image is larger
SHRINK_TO = 512
#: Steps after the warm-up a verdict needs: fewer say more about the start-up than about the loop.
MIN_MEASURED_STEPS = 3
#: How the advice asks for a tune whose decode placements are measured under the user's own step (a model step
#: shows what the device path costs the training; fastdata.tools.tune.placement_note).
TUNE_STEP = "--step <your model, e.g. resnet50>"
_STAGE_WORDS = {"read": "reading from storage", "decode": "decoding", "augment": "augmentation",
                "collate": "collating batches", "transfer": "pinning / transfer",
                "device": "the device feeder (decode and crop on the device)"}


@dataclass(frozen=True)
class LoaderFacts:
    """What the meter could learn about the wrapped iterable (for the suggestions)."""

    kind: str  # "fastdata.loader", "torch DataLoader" or "iterable"
    type_name: str
    num_workers: int | None = None
    pin_memory: bool | None = None
    batch_size: int | None = None
    dataset: str | None = None
    folder_of_files: bool = False  # torchvision ImageFolder / DatasetFolder: one file per sample
    decode: str | None = None  # a fastdata image loader's decode placement: "worker" or "device"
    progressive: int | None = None  # progressive JPEGs its dataset stores (manifest stats "gpu_kinds"; None: unknown)
    not_jpeg: int | None = None  # images that are not JPEGs its dataset stores (the same; decoded in the workers)
    stored: int | None = None  # images its dataset stores (the same counts' sum)
    largest_side: int | None = None  # the longest side of any image its dataset stores (None: not known)

    @classmethod
    def of(cls, obj: Any) -> LoaderFacts:
        if isinstance(getattr(obj, "stage_times", None), StageTimes) and hasattr(obj, "dataset"):
            manifest = getattr(obj.dataset, "manifest", None)
            fmt = getattr(manifest, "format", None)
            kinds = (getattr(manifest, "stats", None) or {}).get("gpu_kinds") or {}
            return cls("fastdata.loader", type(obj).__name__, getattr(obj, "num_workers", None),
                       getattr(obj, "pin_memory", None), getattr(obj, "batch_size", None),
                       f"fastdata {fmt}" if fmt else None, decode=getattr(obj, "decode", None),
                       progressive=kinds.get("progressive"), not_jpeg=kinds.get("not_jpeg"),
                       stored=sum(kinds.values()) if kinds else None, largest_side=largest_side(obj.dataset))
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.utils.data.DataLoader):
            data = obj.dataset
            names = {c.__name__ for c in type(data).__mro__}
            return cls("torch DataLoader", type(obj).__name__, obj.num_workers, bool(obj.pin_memory),
                       obj.batch_size, type(data).__name__, bool(names & {"DatasetFolder", "ImageFolder"}))
        return cls("iterable", type(obj).__name__)


def largest_side(data: Any) -> int | None:
    """The longest side of any image a fastdata image dataset stores: from an LMDB dataset's stored sizes (a
    mixture's: its sources'), else the conversion's `--max-size` when it set one; None when not known (WebDataset
    shards converted without --max-size, text, another dataset)."""
    sources = getattr(data, "sources", None)
    if isinstance(sources, list) and sources:
        sides = [largest_side(source) for source in sources]
        return None if None in sides else max(sides)  # type: ignore[type-var]
    reader = getattr(data, "reader", None)
    try:
        widths, heights = reader.widths, reader.heights  # type: ignore[union-attr]
    except AttributeError:
        widths = heights = None
    if widths is not None and len(widths):
        return int(max(widths.max(), heights.max()))
    options = getattr(getattr(data, "manifest", None), "options", None) or {}
    bound = options.get("max_size")
    return int(bound) if isinstance(bound, int) and bound > 0 else None


@dataclass
class Window:
    """The measured window (after warm-up): host-side figures, and the GPU's view when CUDA events ran."""

    steps: int
    samples: int | None
    seconds: float
    host_wait_s: float
    warmup_steps: int
    gpu_wait_s: float | None = None
    gpu_seconds: float | None = None


@dataclass
class MeterReport:
    """What `Meter.report()` returns. `steps`, `samples` and `seconds` cover every step; rates and the data
    wait cover the measured window after the first `warmup_steps` (whose time `first_batch_s` shows).
    `samples` is None when no batch size could be inferred. `system` holds the sampled figures (None where
    unavailable, with the reason in `system["unavailable"]`); `stages` the per-stage worker seconds of a
    fastdata loader. `ranks` compares the ranks of a torch.distributed job (`fastdata.meter.ranks.compare_ranks`),
    `trace` is the trace file written."""

    steps: int
    samples: int | None
    seconds: float
    samples_per_s: float | None
    steps_per_s: float
    data_wait_s: float
    data_wait_fraction: float
    verdict: str
    reasons: list[str]
    suggestions: list[str]
    system: dict[str, Any] | None
    first_batch_s: float | None = None
    measured_steps: int = 0
    measured_seconds: float = 0.0
    warmup_steps: int = 0
    timed_on: str = "host"  # "host" or "cuda-events"
    host_data_wait_s: float = 0.0
    stages: dict[str, Any] | None = None
    loader: dict[str, Any] = field(default_factory=dict)
    timeline: dict[str, Any] = field(default_factory=dict)
    trace: str | None = None  # the trace file written (`trace=`), this rank's
    epoch_starts: dict[str, Any] | None = None  # passes after the first: their first batch's wait
    ranks: dict[str, Any] | None = None  # every rank's data wait and the straggler (`fastdata.meter.ranks`)

    def to_dict(self) -> dict[str, Any]:
        """Every figure as plain JSON types."""
        return asdict(self)

    def __str__(self) -> str:
        return format_report(self)


def build_report(*, steps: int, samples: int | None, seconds: float, first_batch_s: float | None, window: Window,
                 system: dict[str, Any] | None, stages: StageTimes | None, loader: LoaderFacts, cuda: bool,
                 timeline: dict[str, Any], epoch_starts: list[float] | None = None,
                 total_wait_s: float = 0.0, warmup_steps: int = 0) -> MeterReport:
    """Assemble the report from what the meter measured (`warmup_steps`: the steps the meter was asked to leave
    out, whether or not that many came)."""
    on_gpu = window.gpu_seconds is not None and window.gpu_seconds > 0
    if on_gpu:
        wait, span = float(window.gpu_wait_s or 0.0), float(window.gpu_seconds or 0.0)
    else:
        wait, span = window.host_wait_s, window.seconds
    fraction = min(1.0, wait / span) if span > 0 else 0.0
    stage_dict = _stage_dict(stages)
    measured = max(0, steps - warmup_steps)
    if steps and measured < MIN_MEASURED_STEPS:
        verdict, reasons, suggestions = too_few_steps(steps, measured, warmup_steps)
    else:
        verdict, reasons, suggestions = diagnose(steps=steps, wait_fraction=fraction, wait_s=wait, seconds=span,
                                                 system=system, stages=stage_dict, loader=loader, cuda=cuda)
    if on_gpu and steps:
        host = window.host_wait_s / window.seconds if window.seconds > 0 else 0.0
        reasons.append(f"timed on the GPU with CUDA events: the GPU sat idle waiting for data {fraction:.0%} of "
                       f"the time (the host waited {host:.0%})")
    starts = _epoch_starts(epoch_starts or [], total_wait_s)
    if starts is not None:
        reasons.append(starts["line"])
    return MeterReport(
        steps=steps, samples=samples, seconds=round(seconds, 6),
        samples_per_s=_rate(window.samples, window.seconds),
        steps_per_s=_rate(window.steps, window.seconds) or 0.0,
        data_wait_s=round(wait, 6), data_wait_fraction=round(fraction, 4), verdict=verdict, reasons=reasons,
        suggestions=suggestions, system=system,
        first_batch_s=None if first_batch_s is None else round(first_batch_s, 6),
        measured_steps=window.steps, measured_seconds=round(window.seconds, 6), warmup_steps=window.warmup_steps,
        timed_on="cuda-events" if on_gpu else "host", host_data_wait_s=round(window.host_wait_s, 6),
        stages=stage_dict, loader=asdict(loader), timeline=timeline, epoch_starts=starts)


def _epoch_starts(waits: list[float], total_wait_s: float) -> dict[str, Any] | None:
    """The waits for the first batch of each pass after the first (the epoch-start stalls), on their own line."""
    if not waits:
        return None
    share = sum(waits) / total_wait_s if total_wait_s > 0 else 0.0
    mean, longest = sum(waits) / len(waits), max(waits)
    line = (f"epoch starts: {len(waits)} later pass{'es' if len(waits) > 1 else ''} began after a wait of "
            f"{mean:.2f} s{' on average' if len(waits) > 1 else ''}"
            f"{f' (longest {longest:.2f} s)' if len(waits) > 1 else ''}, {share:.0%} of all data wait")
    return {"passes": len(waits), "mean_s": round(mean, 6), "max_s": round(longest, 6),
            "share_of_wait": round(share, 4), "line": line}


def _rate(count: int | None, seconds: float) -> float | None:
    if count is None:
        return None
    return round(count / seconds, 3) if seconds > 0 else 0.0


def _stage_dict(stages: StageTimes | None) -> dict[str, Any] | None:
    if stages is None or stages.total <= 0:
        return None
    seconds = stages.seconds()
    found: dict[str, Any] = {"seconds": {k: round(v, 6) for k, v in seconds.items()},
                             "share": {k: round(v / stages.total, 4) for k, v in seconds.items()},
                             "worker_seconds": round(stages.total, 6), "batches": stages.batches}
    batches = stages.parts.get("batches", 0)
    if batches > 0:  # decode="device": its feeder's threads and streams, milliseconds per batch
        found["feeder_ms"] = {k: round(1000 * v / batches, 3) for k, v in stages.parts.items() if k != "batches"}
    return found


def _feeder_line(feeder: dict[str, float]) -> str:
    """The device feeder's threads and streams per batch, in one line."""
    line = (f"device feeder per batch: decode thread {feeder.get('decode', 0) + feeder.get('other', 0):.1f} ms busy "
            f"(waited {feeder.get('workers', 0):.1f} ms for the workers, {feeder.get('decoded_full', 0):.1f} ms "
            f"for the resize thread); resize thread {feeder.get('resize', 0):.1f} ms busy (waited "
            f"{feeder.get('decode_wait', 0):.1f} ms for a decoded batch, {feeder.get('slot_wait', 0):.1f} ms for a "
            f"free slot); the training thread waited {feeder.get('starved', 0):.1f} ms")
    if feeder.get("decode_gpu") or feeder.get("resize_gpu"):
        line += (f"; GPU: decode stream {feeder.get('decode_gpu', 0):.1f} ms, resize stream "
                 f"{feeder.get('resize_gpu', 0):.1f} ms")
    return line


# -------------------------------------------------------------------------------------------------
# diagnosis


def too_few_steps(steps: int, measured: int, warmup_steps: int) -> tuple[str, list[str], list[str]]:
    """(verdict, reasons, suggestions) when too few steps came after the warm-up for a verdict: what is missing."""
    left_out = f"the first {warmup_steps} left out as start-up" if warmup_steps != 1 else \
        "the first left out as start-up"
    needed = warmup_steps + MIN_MEASURED_STEPS
    return TOO_FEW_STEPS, [
        f"{steps} step{'s' * (steps != 1)} in all, {measured} after the warm-up ({left_out}): a verdict needs at "
        f"least {MIN_MEASURED_STEPS} measured steps, so none is given; the figures above are not a steady state"], [
        f"run at least {needed} steps before reading the report (more for steady figures: a few hundred, or a "
        "whole epoch)"]


def diagnose(*, steps: int, wait_fraction: float, wait_s: float, seconds: float, system: dict[str, Any] | None,
             stages: dict[str, Any] | None, loader: LoaderFacts, cuda: bool) -> tuple[str, list[str], list[str]]:
    """(verdict, reasons, suggestions) from the measured figures."""
    if steps == 0:
        return NO_STEPS, ["no steps measured: the iterable yielded nothing, so there is nothing to judge"], [
            "check that the iterable yields batches: an empty dataset, drop_last=True with fewer samples than a "
            "batch, or a generator already used up all yield nothing"]
    sysf = system or {}
    cores = sysf.get("cores") or available_cores()
    contended = _contention(sysf, cores)
    if wait_fraction >= INPUT_BOUND_AT:
        verdict = "input-bound"
    elif wait_fraction < COMPUTE_BOUND_BELOW:  # the step sets the pace: its own work, or CPU taken from it
        verdict = "cpu-contended" if contended else "compute-bound"
    else:
        verdict = "balanced"
    facts = [f"the loop waited for data {wait_fraction:.0%} of the time ({wait_s:.2f} s of {seconds:.2f} s)"]
    facts += _system_facts(sysf, loader, cores)
    if verdict == "compute-bound":
        cause_key, cause = "none", "the loader keeps up; the step itself sets the pace"
    elif verdict == "cpu-contended":
        cause_key, cause = "contention", (f"the loader keeps up, but {contended}: the step is slowed by them, so "
                                          "its pace says little about the model or the loader")
    else:
        cause_key, cause = _cause(sysf, stages, loader, cores)
    reasons = ["; ".join(facts) + ": " + cause]
    if stages:
        share = sorted(stages["share"].items(), key=lambda kv: -kv[1])
        reasons.append("loader time by stage: " + ", ".join(f"{k} {v:.0%}" for k, v in share if v > 0)
                       + f" (of {stages['worker_seconds']:.2f} seconds: the workers' stages summed over workers"
                       + ("; device: the feeder thread" if stages["share"].get("device") else "") + ")")
        if stages.get("feeder_ms"):
            reasons.append(_feeder_line(stages["feeder_ms"]))
    gpu = sysf.get("gpu_util_percent")
    if gpu is not None:
        jpeg = sysf.get("gpu_jpeg_util_percent")
        reasons.append(f"GPU {gpu:.0f}% busy on average" + (f"; its JPEG engines {jpeg:.0f}%" if jpeg is not None
                                                             else ""))
    elif system is not None:
        why = sysf.get("unavailable", {}).get("gpu_util_percent")
        if why:
            reasons.append(f"no GPU figures: {why}")
    return verdict, reasons, _suggestions(verdict, cause_key, sysf, stages, loader, cuda, cores)


def _system_facts(sysf: dict[str, Any], loader: LoaderFacts, cores: int) -> list[str]:
    facts = []
    workers, main = sysf.get("workers_cpu_cores"), sysf.get("main_cpu_cores")
    if loader.num_workers and workers is not None:
        facts.append(f"{loader.num_workers} worker{'s' * (loader.num_workers != 1)} used {workers:.1f} of {cores} "
                     f"core{'s' * (cores != 1)}")
    elif workers is not None and sysf.get("workers"):
        facts.append(f"worker processes used {workers:.1f} of {cores} cores")
    if main is not None and (main >= 0.5 or not facts):
        facts.append(f"the training process itself used {main:.1f} cores")
    others = sysf.get("others_cpu_cores")
    if others is not None and others >= 0.05 * _machine_cores(sysf, cores):
        facts.append(f"other processes used {others:.1f} cores")
    if sysf.get("cpu_percent") is not None:
        facts.append(f"CPU {sysf['cpu_percent']:.0f}% busy")
    if sysf.get("iowait_percent") is not None:
        facts.append(f"iowait {sysf['iowait_percent']:.0f}%")
    if sysf.get("disk_read_mb_s") is not None:
        facts.append(f"disk reads {sysf['disk_read_mb_s']:.1f} MB/s")
    return facts


def _cause(sysf: dict[str, Any], stages: dict[str, Any] | None, loader: LoaderFacts,
           cores: int) -> tuple[str, str]:
    """(key, sentence) naming the wall of an input-bound loop."""
    wall, share = None, 0.0
    if stages:
        wall, share = max(stages["share"].items(), key=lambda kv: kv[1])
    iowait, cpu = sysf.get("iowait_percent"), sysf.get("cpu_percent")
    workers = loader.num_workers
    used, main = sysf.get("workers_cpu_cores"), sysf.get("main_cpu_cores")
    in_process = workers == 0 or (loader.kind == "iterable" and not sysf.get("workers"))
    of_worker_time = f" ({share:.0%} of worker time)" if wall else ""
    if (iowait is not None and iowait >= 20) or (wall == "read" and share >= 0.4):
        return "read", "reading from storage is the bottleneck" + (f" ({wall} {share:.0%} of worker time)"
                                                                  if wall == "read" else "")
    if wall == "transfer" and share >= 0.4:
        return "transfer", f"pinning / transfer is the bottleneck{of_worker_time}"
    if wall == "device" and share >= 0.4:
        return "device", f"{_STAGE_WORDS['device']} is the bottleneck ({share:.0%} of the loader's time)"
    contended = _contention(sysf, cores)
    if contended:
        return "contention", f"the CPU is saturated, mostly by others: {contended}"
    if cpu is not None and cpu >= SATURATED_AT:
        if wall in ("decode", "augment", "collate"):
            return wall, f"{_STAGE_WORDS[wall]} is the bottleneck{of_worker_time}"
        if not in_process:
            return "decode", "decoding and augmenting on the CPU is the bottleneck (the CPU is saturated)"
    if (not in_process and workers and main is not None and main >= MAIN_WALL_CORES and used is not None
            and used < IDLE_WORKERS_SHARE * workers):
        where = ("its device feeder (decode=\"device\") runs there beside the step"
                 if loader.decode == "device" else "the step's own host work runs there")
        return "main-process", (f"the training process is the wall: it used {main:.1f} cores (about one Python "
                                f"thread's worth) while {workers} worker{'s' * (workers != 1)} used {used:.1f}: "
                                f"{where}")
    if in_process:
        if main is not None and main < 0.5:
            return "other", (f"the training process itself was mostly idle ({main:.1f} cores) while it waited: "
                             "the iterable waits on something outside it (storage, network, a sleep)")
        return "in-process", "batches are made inside the training process, one at a time, while the step waits"
    if workers is not None and workers < cores and (used is None or used >= 0.7 * workers):
        return "workers", f"too few workers: {workers} busy workers on {cores} cores leave CPU idle"
    if wall in ("decode", "augment", "collate"):
        return wall, f"{_STAGE_WORDS[wall]} is the bottleneck{of_worker_time}, though the CPU is not saturated"
    if cpu is None:
        return "unknown", "no system figures to say why"
    return "other", ("the CPU is not saturated and iowait is low: the loader waits on something else "
                     "(network storage, a lock, or work in the training process)")


def _machine_cores(sysf: dict[str, Any], cores: int) -> int:
    """The CPUs the busy percentage covers (every CPU of the machine), else the cores this job may use."""
    return len(sysf.get("cpu_per_core_percent") or []) or cores


def others_share(sysf: dict[str, Any]) -> float | None:
    """The share of the machine's CPU (0 to 1) that other processes took while the meter sampled, from its system
    figures (`MeterReport.system`); None without the figure (no psutil, or not sampled)."""
    others = sysf.get("others_cpu_cores")
    if others is None:
        return None
    return others / max(1, _machine_cores(sysf, sysf.get("cores") or available_cores()))


def _contention(sysf: dict[str, Any], cores: int) -> str | None:
    """Words naming the CPU other processes took, when the machine was saturated and they took a large share
    of it (so they slowed this job); None otherwise or without the figures."""
    others, cpu = sysf.get("others_cpu_cores"), sysf.get("cpu_percent")
    used, main = sysf.get("workers_cpu_cores"), sysf.get("main_cpu_cores")
    machine = _machine_cores(sysf, cores)
    if cpu is None or (used is None and main is None):
        return None
    own = (used or 0.0) + (main or 0.0)
    if others is None:  # figures without the sampled one: the busy cores less ours
        others = max(0.0, cpu / 100 * machine - own)
    if cpu < SATURATED_AT or others < CONTENDED_SHARE * machine:
        return None
    return (f"other processes took {others:.1f} of the machine's {machine} cores (CPU {cpu:.0f}% busy) while this "
            f"job used {own:.1f}")


def _suggestions(verdict: str, cause: str, sysf: dict[str, Any], stages: dict[str, Any] | None,
                 loader: LoaderFacts, cuda: bool, cores: int) -> list[str]:
    out: list[str] = []
    if verdict == "cpu-contended":
        out.append("measure again where the job has the cores to itself (or with less running beside it) before "
                   "tuning the model or the loader: other processes took the CPU this loop needed")
        return out
    if verdict == "compute-bound":
        gpu = sysf.get("gpu_util_percent")
        if gpu is not None and gpu < 50:
            out.append(f"the GPU is only {gpu:.0f}% busy although data is there: the step is held up on the host "
                       "(Python / kernel-launch overhead): try torch.compile, CUDA graphs or a larger batch")
        out.append("data loading is not what limits this loop: speed up the step itself (mixed precision, "
                   "torch.compile, channels_last, a larger batch)")
        return out
    packed = loader.kind == "fastdata.loader"
    convert = ("pack the dataset once and load it with fastdata: `fastdata convert imagefolder SRC OUT.lmdb`, "
               "then `fastdata.loader(\"OUT.lmdb\")` (batches built in the workers, JPEGs decoded at reduced scale)")
    shrink = _shrink(loader.largest_side)
    workers = loader.num_workers
    if cause == "read":
        out.append(convert.replace("pack the dataset once", "pack the small files into one LMDB file (sequential, "
                                                            "few large reads)") if not packed else
                   "copy the dataset to a local SSD (or /dev/shm when it fits in RAM) instead of a network or "
                   "spinning disk")
        if shrink:
            out.append(shrink)
        out.append(f"raise num_workers (now {workers if workers is not None else '?'}) to keep more reads in flight")
    elif cause in ("decode", "augment", "collate"):
        if not packed:
            out.append(convert)
        if cause == "decode" and shrink:
            out.append(shrink)
            if cuda and loader.decode != "device":
                out.append("decode on the GPU: `fastdata.loader(..., decode=\"device\")`, or let `fastdata tune "
                           f"--device cuda {TUNE_STEP}` measure both placements for `decode=\"auto\"`")
            if loader.decode != "device" and loader.progressive and loader.stored and (
                    loader.progressive >= PROGRESSIVE_WORTH_REWRITING * loader.stored):
                out.append(f"{loader.progressive / loader.stored:.0%} of the stored images ({loader.progressive:,}) "
                           "are progressive JPEGs, which cost a worker about 3x a baseline file (decoded whole "
                           "before the crop; benchmarks/baseline_layout.py): re-convert with `--jpeg-layout "
                           "baseline` (lossless: the same pixels)")
            if loader.decode == "device" and loader.not_jpeg:
                out.append(f"the dataset stores {loader.not_jpeg:,} images that are not JPEGs, which the workers "
                           "decode (the GPU decoders take JPEGs only): re-convert with `--non-jpeg jpeg` to store "
                           "them as JPEGs (lossy, at --quality)")
        if cause == "augment":
            out.append("use a cheaper augmentation, or do it on the GPU on uint8 batches")
        if cause == "collate":
            out.append("keep batches uint8 and normalise on the device (`.float().div_(255)` after `.to(device)`)")
        if workers is not None and workers < cores:
            out.append(f"raise num_workers from {workers} to {cores} (one per core)")
        out.append("give loading more CPU cores (per GPU), or decode fewer / smaller images per step")
    elif cause == "in-process":
        if workers == 0:
            out.append(f"set num_workers={cores} (one per core) so batches are made in parallel, ahead of the step")
        else:
            out.append("make batches in worker processes ahead of the step: a DataLoader with num_workers > 0, or "
                       "`fastdata.loader(...)`")
    elif cause == "device":
        out.append("decode in the workers (`decode=\"worker\"`) if they have the cores, or let `fastdata tune "
                   f"--device cuda {TUNE_STEP}` measure both placements for `decode=\"auto\"`; install nvImageCodec "
                   "(`pip install 'fastdata[gpu-cu13]'`) if `loader.device_decoder` names torchvision")
        if loader.progressive:
            out.append(f"the dataset stores {loader.progressive:,} progressive JPEGs, which the GPU's hardware JPEG "
                       "engines do not take: re-convert with `--jpeg-layout baseline` (lossless), or decode them in "
                       "the workers with `decode=fastdata.DeviceDecodeOptions(progressive=\"workers\")`; either way "
                       "the device decoder then gets baseline JPEGs only, which the default `backends=\"auto\"` gives "
                       "to the engines alone")
        feeder = (stages or {}).get("feeder_ms") or {}
        decode_ms, resize_ms = feeder.get("decode", 0.0) + feeder.get("other", 0.0), feeder.get("resize", 0.0)
        if decode_ms and decode_ms >= resize_ms:
            out.append(f"the feeder's decode thread sets its pace ({decode_ms:.1f} ms per batch in the decoder's "
                       "call): give the GPU's JPEG engines baseline JPEGs only (`--jpeg-layout baseline --non-jpeg "
                       "jpeg` at conversion), or decode in the workers")
        elif resize_ms:
            out.append(f"the feeder's resize thread sets its pace ({resize_ms:.1f} ms per batch): a smaller "
                       "image_size or fewer, larger batches cost it less host time per image")
    elif cause == "main-process":
        if loader.decode == "device":
            out.append(f"decode in the workers (`decode=\"worker\"`), or let `fastdata tune --device cuda {TUNE_STEP}` "
                       "measure both placements for `decode=\"auto\"`: the feeder shares the training process's GIL")
        else:
            out.append("move host work out of the training loop (into the loader's workers or onto the device); "
                       "torch.compile or CUDA graphs cut the step's own Python and launch overhead")
    elif cause == "contention":
        out.append("run the job where it has the cores to itself, or lower what else runs on this machine")
    elif cause == "workers":
        out.append(f"raise num_workers from {workers} to {cores} (one per core)")
    elif cause == "transfer":
        out.append("pin_memory=True and `.to(device, non_blocking=True)` so copies overlap with compute")
    else:
        if not packed and loader.folder_of_files:
            out.append(convert)
        if workers is not None and workers < cores:
            out.append(f"raise num_workers from {workers} to {cores} (one per core)")
        out.append("check where the data lives (`fastdata doctor PATH`): network filesystems and spinning disks "
                   "hide their wait from iowait")
    if loader.folder_of_files and not packed and convert not in out:
        out.append(convert)
    if cuda and loader.pin_memory is False:
        out.append("pin_memory=True: page-locked batches copy to the GPU faster and asynchronously")
    return out


def _shrink(largest: int | None) -> str | None:
    """The advice to store smaller images, where it can help: the dataset holds images larger than SHRINK_TO
    (or their sizes are not known); None when none is larger."""
    what = (f"re-convert with `--max-size {SHRINK_TO}` (or the smallest size your crop needs): fewer bytes to read "
            "and fewer pixels to decode")
    if largest is None:
        return f"if the images are larger than {SHRINK_TO} px, {what}"
    if largest <= SHRINK_TO:
        return None
    return f"{what} (the largest stored image is {largest:,} px on its longer side)"


# -------------------------------------------------------------------------------------------------
# text


def format_report(r: MeterReport) -> str:
    """A readable multi-line summary."""
    if r.verdict == NO_STEPS:
        return "fastdata.meter: no steps measured (the iterable yielded nothing)\n" + "".join(
            f"  try: {s}\n" for s in r.suggestions).rstrip("\n")
    lines = [f"fastdata.meter: {r.verdict} (data wait {r.data_wait_fraction:.0%})"]
    samples = f" ({r.samples:,} samples)" if r.samples is not None else ""
    first = f"; first batch after {r.first_batch_s:.2f} s" if r.first_batch_s is not None else ""
    lines.append(f"  steps        {r.steps:,}{samples} in {r.seconds:.2f} s{first}")
    rate = f"{r.samples_per_s:,.1f} samples/s, " if r.samples_per_s is not None else ""
    after = {0: "", 1: " (after the first step)"}.get(r.warmup_steps, f" (after the first {r.warmup_steps} steps)")
    lines.append(f"  throughput   {rate}{r.steps_per_s:,.2f} steps/s{after}")
    lines.append(f"  data wait    {r.data_wait_s:.2f} s of {r.measured_seconds:.2f} s = {r.data_wait_fraction:.0%}"
                 + (" (GPU view, CUDA events)" if r.timed_on == "cuda-events" else ""))
    if r.system is not None:
        lines.append(f"  system       {_system_line(r.system)}")
    if r.stages:
        lines.append("  stages       " + ", ".join(f"{k} {r.stages['share'][k]:.0%}" for k in STAGES)
                     + f" of {r.stages['worker_seconds']:.2f} worker-s")
    if r.ranks:
        lines.append(f"  ranks        {ranks_line(r.ranks)}")
    if r.trace:
        lines.append(f"  trace        {r.trace} (open it in ui.perfetto.dev or chrome://tracing)")
    lines.append("  why")
    lines += [f"    - {reason}" for reason in r.reasons]
    if r.suggestions:
        lines.append("  try")
        lines += [f"    - {s}" for s in r.suggestions]
    return "\n".join(lines)


def _system_line(s: dict[str, Any]) -> str:
    def fmt(name: str, text: str) -> str:
        return "n/a" if s.get(name) is None else text.format(s[name])

    parts = [f"CPU {fmt('cpu_percent', '{:.0f}%')} of {s.get('cores')} cores",
             f"iowait {fmt('iowait_percent', '{:.0f}%')}",
             f"disk {fmt('disk_read_mb_s', '{:.1f} MB/s')}",
             f"memory {fmt('rss_mb', '{:,.0f} MB')} (main RSS + workers' USS)",
             f"workers {fmt('workers_cpu_cores', '{:.1f} cores')}",
             f"other processes {fmt('others_cpu_cores', '{:.1f} cores')}",
             f"GPU {fmt('gpu_util_percent', '{:.0f}%')}"]
    return ", ".join(parts)
