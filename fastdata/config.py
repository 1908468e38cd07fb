"""Option parsing shared by the API and the CLI."""

from __future__ import annotations

import os
import re

from fastdata.errors import ConfigError

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}


def parse_size(text: str | int) -> int:
    """Parse a byte count such as `256MB`, `64KB`, `1.5GiB` or `1000000` (KB/MB/GB are powers of 1000,
    KiB/MiB/GiB powers of 1024)."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        if not match or match.group(2).upper() not in _SIZE_UNITS:
            raise ConfigError(f"cannot read {text!r} as a size: use e.g. 256MB, 64KB, 1GiB or a byte count")
        value = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])
    if value <= 0:
        raise ConfigError(f"a size must be positive, got {text!r}")
    return value


def available_cores() -> int:
    """CPU cores this process may run on (respects affinity masks and container cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1
