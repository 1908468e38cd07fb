"""Background system sampler for the meter: CPU (total, per core, iowait), disk reads, memory (this process's RSS
plus its workers' USS, `rss_mb`: never a sum of forked processes' RSS) and CPU of this process and its workers
(psutil), the CPU every other process on the machine took meanwhile (busy cores less ours: a job slowed by another
one is told apart from one slowed by its own work), GPU utilisation and memory (NVML). One sample per `interval` on
a `fastdata.background.Background` thread, plus one at stop, so even a short run has figures. A figure that cannot
be had is `None`, and `unavailable` says why."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fastdata.background import Background
from fastdata.config import available_cores

FIGURES = ("cpu_percent", "cpu_per_core_percent", "iowait_percent", "disk_read_mb_s", "rss_mb", "workers",
           "workers_cpu_cores", "main_cpu_cores", "others_cpu_cores", "gpu_util_percent", "gpu_util_per_gpu_percent",
           "gpu_memory_used_mb", "gpu_jpeg_util_percent")
RESCAN_EVERY = 5  # readings between two walks of the process table for new children


class _Mean:
    """Time-weighted mean of a figure over the sampled intervals."""

    __slots__ = ("total", "weight")

    def __init__(self) -> None:
        self.total = 0.0
        self.weight = 0.0

    def add(self, value: float, dt: float) -> None:
        self.total += value * dt
        self.weight += dt

    def value(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


class SystemSampler:
    """Samples system figures every `interval` seconds between `start()` and `stop()`.

    `latest` holds the last sample (for live log lines), also handed to `on_sample` (the meter's trace);
    `summary()` the means (RSS and memory: maxima).
    """

    def __init__(self, interval: float = 1.0, gpu: bool = True, pid: int | None = None,
                 on_sample: Callable[[float, dict[str, float | None]], None] | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.interval = interval
        self.pid = os.getpid() if pid is None else pid
        self.latest: dict[str, float | None] = {}
        self.on_sample = on_sample  # called with (interval start, time.monotonic s; its figures) after each sample
        self._want_gpu = gpu
        self._lock = threading.Lock()
        self._thread: Background | None = None
        self._unavailable: dict[str, str] = {}
        self._means: dict[str, _Mean] = {}
        self._per_core: list[_Mean] = []
        self._per_gpu: list[_Mean] = []
        self._max: dict[str, float] = {}
        self._samples = 0
        self._psutil: Any = None
        self._nvml: Any = None
        self._prev: dict[str, Any] = {}
        self._main: Any = None  # psutil.Process of `pid`, and of its children (pid -> Process)
        self._known: dict[int, Any] = {}
        self._readings = 0
        self._failure: str | None = None

    # ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Take the first reading and start the background thread (no-op if already running)."""
        if self._thread is not None:
            return
        self._readings = 0  # workers may have come or gone between passes
        self._open()
        self._prev = self._read()
        self._thread = Background(self._run, "fastdata-meter-sampler").start()

    def stop(self) -> None:
        """Take a last reading and stop the thread."""
        if self._thread is None:
            return
        thread, self._thread = self._thread, None
        try:
            thread.close()
        finally:
            self._tick()
            if self._nvml is not None:
                self._nvml.close()
                self._nvml = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def summary(self) -> dict[str, Any]:
        """The sampled figures: means over time (RSS, workers and GPU memory: maxima), `None` where unavailable,
        with the reason in `unavailable`."""
        with self._lock:
            out: dict[str, Any] = {"interval_s": self.interval, "samples": self._samples, "cores": available_cores()}
            for name in FIGURES:
                out[name] = None
            for name, mean in self._means.items():
                value = mean.value()
                out[name] = None if value is None else round(value, 3)
            for name, value in self._max.items():
                out[name] = round(value, 3)
            if self._per_core and self._per_core[0].weight > 0:
                out["cpu_per_core_percent"] = [round(m.value() or 0.0, 1) for m in self._per_core]
            if self._per_gpu and self._per_gpu[0].weight > 0:
                out["gpu_util_per_gpu_percent"] = [round(m.value() or 0.0, 1) for m in self._per_gpu]
            if self._samples == 0:
                reasons = {name: "no sample taken yet" for name in FIGURES if out[name] is None}
            else:
                reasons = {name: self._unavailable.get(name, self._failure or "not sampled") for name in FIGURES
                           if out[name] is None}
            out["unavailable"] = reasons
            return out

    # ---------------------------------------------------------------------------------------------
    def _open(self) -> None:
        try:
            import psutil

            self._psutil = psutil
        except ImportError:
            self._psutil = None
        if self._psutil is None:
            for name in FIGURES:
                if not name.startswith("gpu"):
                    self._unavailable[name] = "psutil is not installed (pip install psutil)"
        elif not sys.platform.startswith("linux"):
            self._unavailable["iowait_percent"] = "iowait is only reported on Linux"
        if self._want_gpu:
            self._nvml, reason = _open_nvml()
        else:
            reason = "GPU sampling is off"
        if reason:
            for name in ("gpu_util_percent", "gpu_util_per_gpu_percent", "gpu_memory_used_mb",
                         "gpu_jpeg_util_percent"):
                self._unavailable[name] = reason

    def _run(self, stopping: threading.Event) -> None:
        while not stopping.wait(self.interval):
            self._tick()

    def _tick(self) -> None:
        try:
            now = self._read()
        except Exception as exc:  # a figure lost, never the training loop
            self._failure = f"sampling failed: {exc!r}"
            return
        try:
            self._account(self._prev, now)
        except Exception as exc:
            self._failure = f"sampling failed: {exc!r}"
        finally:
            self._prev = now

    def _read(self) -> dict[str, Any]:
        """One raw reading (cumulative counters), taken as close together as the calls allow."""
        reading: dict[str, Any] = {"t": time.monotonic()}
        ps = self._psutil
        if ps is not None:
            try:
                reading["cpu"] = ps.cpu_times(percpu=True)
            except Exception as exc:
                self._unavailable["cpu_percent"] = f"psutil.cpu_times failed: {exc}"
            try:
                disk = ps.disk_io_counters(perdisk=False)
                if disk is None:
                    self._unavailable["disk_read_mb_s"] = "no disk counters visible (psutil.disk_io_counters)"
                else:
                    reading["disk"] = disk.read_bytes
            except Exception as exc:
                self._unavailable["disk_read_mb_s"] = f"psutil.disk_io_counters failed: {exc}"
            reading["procs"] = self._read_processes(ps)
        if self._nvml is not None:
            reading["gpu"] = self._nvml.utilization()
        return reading

    def _read_processes(self, ps: Any) -> dict[str, Any] | None:
        """CPU seconds and RSS of the process and its children. Listing the children walks every process on
        the machine, so it is redone only every `RESCAN_EVERY` readings; known children are read directly."""
        try:
            if self._main is None:
                self._main = ps.Process(self.pid)
            main = self._main
            with main.oneshot():
                times = main.cpu_times()
                main_cpu = times.user + times.system
                reaped = getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0)
                rss = main.memory_info().rss
            scanned = self._readings < 3 or self._readings % RESCAN_EVERY == 0  # workers start with the first steps
            if scanned:
                known = {child.pid: child for child in main.children(recursive=True)}
                self._known = {pid: self._known.get(pid, child) for pid, child in known.items()}
            self._readings += 1
            children: dict[int, float] = {}  # pid -> CPU seconds
            for pid, child in list(self._known.items()):
                try:
                    with child.oneshot():
                        children[pid] = sum(child.cpu_times()[:2])
                        rss += _unique_bytes(child)
                except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                    del self._known[pid]
            return {"main_cpu": main_cpu, "children": children, "reaped": reaped, "rss": rss, "scanned": scanned}
        except Exception as exc:
            self._unavailable["rss_mb"] = f"could not read process {self.pid}: {exc}"
            return None

    def _account(self, prev: dict[str, Any], now: dict[str, Any]) -> None:
        dt = now["t"] - prev["t"]
        if dt <= 0.005:  # too short to say anything
            return
        with self._lock:
            self._samples += 1
            latest: dict[str, float | None] = {}
            busy = own = None
            if "cpu" in prev and "cpu" in now:
                busy = self._account_cpu(prev["cpu"], now["cpu"], dt, latest)
            if "disk" in prev and "disk" in now:
                rate = max(0, now["disk"] - prev["disk"]) / dt / 1e6
                self._mean("disk_read_mb_s").add(rate, dt)
                latest["disk_read_mb_s"] = rate
            if prev.get("procs") and now.get("procs"):
                own = self._account_processes(prev["procs"], now["procs"], dt, latest)
            if busy is not None and own is not None:  # what the rest of the machine took meanwhile
                others = max(0.0, busy - own)
                self._mean("others_cpu_cores").add(others, dt)
                latest["others_cpu_cores"] = others
            if now.get("gpu"):
                self._account_gpu(now["gpu"], dt, latest)
            self.latest = latest
        if self.on_sample is not None:
            self.on_sample(prev["t"], dict(latest))

    def _account_cpu(self, prev: list, now: list, dt: float, latest: dict) -> float | None:
        """Account one interval of the machine's CPU; returns its busy cores (None without a figure)."""
        busy_all = total_all = iowait_all = 0.0
        if len(self._per_core) != len(now):
            self._per_core = [_Mean() for _ in now]
        for core, (a, b) in enumerate(zip(prev, now, strict=False)):
            total = _cpu_total(b) - _cpu_total(a)
            idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
            if total <= 0:
                continue
            busy = max(0.0, total - idle)
            self._per_core[core].add(100.0 * busy / total, dt)
            busy_all += busy
            total_all += total
            iowait_all += getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0)
        if total_all > 0:
            cpu = 100.0 * busy_all / total_all
            self._mean("cpu_percent").add(cpu, dt)
            latest["cpu_percent"] = cpu
            if sys.platform.startswith("linux"):
                iowait = 100.0 * max(0.0, iowait_all) / total_all
            self._mean("iowait_percent").add(iowait, dt)
            latest["iowait_percent"] = iowait
            return busy_all / total_all * len(now)  # busy CPU-seconds over all CPU-seconds, in cores
        return None

    def _account_processes(self, prev: dict, now: dict, dt: float, latest: dict) -> float:
        """Account one interval of this process and its workers; returns the cores they used together."""
        main = max(0.0, now["main_cpu"] - prev["main_cpu"]) / dt
        used = 0.0
        for pid, cpu in now["children"].items():
            if pid in prev["children"]:
                used += max(0.0, cpu - prev["children"][pid])
            elif prev["scanned"]:  # not there when `prev` walked the process table: born since, all its CPU is new
                used += cpu
            # else: older, first seen now (between walks of the process table): no baseline, skip once
        # workers that ended since (a DataLoader's, at the end of each pass): the kernel adds their whole CPU
        # time to ours as reaped children; what was not counted yet is that less what they had at `prev`
        gone = sum(cpu for pid, cpu in prev["children"].items() if pid not in now["children"])
        used += max(0.0, now["reaped"] - prev["reaped"] - gone)
        workers = used / dt
        self._mean("main_cpu_cores").add(main, dt)
        self._mean("workers_cpu_cores").add(workers, dt)
        latest["workers_cpu_cores"] = workers
        latest["main_cpu_cores"] = main
        latest["rss_mb"] = now["rss"] / 2**20
        self._max["rss_mb"] = max(self._max.get("rss_mb", 0.0), now["rss"] / 2**20)
        self._max["workers"] = max(self._max.get("workers", 0.0), float(len(now["children"])))
        return main + workers

    def _account_gpu(self, uses: list, dt: float, latest: dict) -> None:
        if len(self._per_gpu) != len(uses):
            self._per_gpu = [_Mean() for _ in uses]
        seen = [u for u in uses if u is not None]
        for mean, use in zip(self._per_gpu, uses, strict=True):
            if use is not None:
                mean.add(use.util_percent, dt)
        if seen:
            util = sum(u.util_percent for u in seen) / len(seen)
            self._mean("gpu_util_percent").add(util, dt)
            latest["gpu_util_percent"] = util
            jpeg = [u.jpeg_util_percent for u in seen if u.jpeg_util_percent is not None]
            if jpeg:
                self._mean("gpu_jpeg_util_percent").add(sum(jpeg) / len(jpeg), dt)
                latest["gpu_jpeg_util_percent"] = sum(jpeg) / len(jpeg)
            used = sum(u.memory_used_mb for u in seen)
            latest["gpu_memory_used_mb"] = used
            self._max["gpu_memory_used_mb"] = max(self._max.get("gpu_memory_used_mb", 0.0), used)

    def _mean(self, name: str) -> _Mean:
        mean = self._means.get(name)
        if mean is None:
            mean = self._means[name] = _Mean()
        return mean


def _unique_bytes(process: Any) -> int:
    """A child's own memory: its USS (pages no other process maps), since a forked worker's RSS repeats the pages
    it shares with the parent (16 forked workers' RSS once summed to 20-81 GB on a 128 GB machine); its RSS where
    the USS cannot be read."""
    try:
        return process.memory_full_info().uss
    except Exception:  # AccessDenied, or a platform without USS
        return process.memory_info().rss


def _cpu_total(times: Any) -> float:
    """All CPU time of a psutil cpu_times tuple; guest time is already inside user time on Linux."""
    return sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _open_nvml() -> tuple[Any, str | None]:
    from fastdata.meter.gpu import Nvml

    return Nvml.open()
