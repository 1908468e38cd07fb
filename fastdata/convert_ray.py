"""`fastdata convert ... --engine ray`: verify and encode the source images on a Ray cluster (a local Ray
instance when no address is given), `pip install 'fastdata[ray]'`.

The Ray workers run the same per-file task as the local process pool, results come back in task order and the
driver writes them, checkpoints included, exactly as a local conversion does: the dataset is the same (same
samples, labels, manifest counts; byte-identical WebDataset shards) and an interrupted Ray conversion resumes
with either engine. On a cluster every node must read the source tree at the same path (a shared file system)
and have fastdata installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fastdata.errors import ConfigError

ENGINES = ("local", "ray")


def ray_results(work: Callable[[Any], Any], tasks: list[Any], workers: int | None, address: str | None,
                initializer: Callable[[], None]) -> Iterator[Any]:
    """`work(task)` for every task, in task order, over a pool of `workers` Ray processes (None: every CPU
    of the cluster). Starts a local Ray instance (or connects to `address`) unless Ray is already initialised,
    and shuts down only what it started."""
    try:
        import ray
        from ray.util.multiprocessing import Pool
    except ImportError as exc:
        raise ConfigError("--engine ray needs Ray: pip install 'fastdata[ray]'") from exc
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, num_cpus=workers if address is None else None, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    try:
        with Pool(processes=workers, initializer=initializer) as pool:
            yield from pool.imap(work, tasks, chunksize=8)
    finally:
        if started_here:
            ray.shutdown()
