"""Every rank's data wait side by side, in a torch.distributed job: the meter's report gathers each rank's figures
(one `all_gather_object`) and names the rank that waits for data most (the straggler) when it stands out.

In DDP every rank steps at the pace of the slowest, so the others' extra time shows as compute (they wait in the
gradient all-reduce) and only the straggler's shows as data wait: the rank with the largest data-wait fraction is
the one holding the job up. `compare_ranks` is a pure function of the gathered figures, tested with made-up ones;
the gather itself is tested with two real processes."""

from __future__ import annotations

import statistics
import sys
from typing import Any

STRAGGLER_GAP = 0.10  # data-wait fraction above the other ranks' median from which the slowest rank is named


def distributed_rank() -> tuple[int, int] | None:
    """(rank, world size) when torch.distributed is initialised with more than one rank, else None (torch is
    not imported for the question)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    return (dist.get_rank(), world) if world > 1 else None


def gather_figures(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's `figures`, in rank order: a collective, so every rank must call it (the meter does, at the end
    of each whole pass)."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, figures)
    return gathered


def compare_ranks(per_rank: list[dict[str, Any]], rank: int, gap: float = STRAGGLER_GAP) -> dict[str, Any]:
    """The ranks compared by data-wait fraction: each one's, the slowest rank, the median of the others and
    `straggler` (the slowest rank when its wait exceeds that median by `gap` or more, else None)."""
    waits = [float(r.get("data_wait_fraction") or 0.0) for r in per_rank]
    slowest = max(range(len(waits)), key=lambda i: (waits[i], -i))
    others = [w for i, w in enumerate(waits) if i != slowest]
    median = statistics.median(others) if others else waits[slowest]
    return {"rank": rank, "world_size": len(per_rank), "data_wait_fraction": [round(w, 4) for w in waits],
            "samples_per_s": [r.get("samples_per_s") for r in per_rank],
            "steps": [r.get("steps") for r in per_rank], "slowest": slowest,
            "others_median_data_wait_fraction": round(median, 4),
            "straggler": slowest if waits[slowest] - median >= gap else None}


def ranks_line(ranks: dict[str, Any]) -> str:
    """One line: "straggler: rank 1, data wait 41% vs median 3% of the other ranks", or the spread when no rank
    stands out."""
    waits, slowest = ranks["data_wait_fraction"], ranks["slowest"]
    median = ranks["others_median_data_wait_fraction"]
    if ranks["straggler"] is not None:
        return (f"straggler: rank {slowest}, data wait {waits[slowest]:.0%} vs median {median:.0%} of the other "
                f"{ranks['world_size'] - 1} rank{'s' if ranks['world_size'] > 2 else ''}")
    return (f"no straggler: data wait {min(waits):.0%} to {max(waits):.0%} over {ranks['world_size']} ranks "
            f"(slowest rank {slowest})")


def straggler_advice(ranks: dict[str, Any]) -> str | None:
    """What to try about a straggler (None without one)."""
    if ranks["straggler"] is None:
        return None
    return (f"rank {ranks['straggler']} holds every rank up: compare its host with the others' (`fastdata doctor "
            "PATH` there: storage, cores, other jobs) and its trace file with theirs")
