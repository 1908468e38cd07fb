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
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import ConfigError

ENGINES = ("local", "ray")


@dataclass
class RayWork:
    """Where Ray ran the work, as Ray itself tells each worker (`ray.get_runtime_context()`): the ids of the Ray
    tasks that ran it and of the Ray actors (pool workers) that ran those tasks."""

    task_ids: set[str] = field(default_factory=set)
    actor_ids: set[str] = field(default_factory=set)
    outside_ray: int = 0  # items whose work ran outside any Ray actor (none: the pool runs in actors)


def _in_ray_context(work: Callable[[Any], Any]) -> Callable[[Any], tuple[str | None, str | None, Any]]:
    """`work`, returning with its result the Ray task and actor that ran it."""
    def run(task: Any) -> tuple[str | None, str | None, Any]:
        import ray

        context = ray.get_runtime_context()
        return context.get_task_id(), context.get_actor_id(), work(task)

    return run


def require_ray() -> None:
    """Raise ConfigError (before anything is written) when Ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"--engine ray needs Ray: pip install 'fastdata[ray]' ({exc})") from None


def ray_results(work: Callable[[Any], Any], tasks: list[Any], workers: int | None, address: str | None,
                initializer: Callable[..., None], seen: RayWork | None = None, initargs: tuple = (),
                chunksize: int = 8) -> Iterator[Any]:
    """`work(task)` for every task, in task order, over a pool of `workers` Ray processes (None: every CPU
    of the cluster), each set up once by `initializer(*initargs)`. Starts a local Ray instance (or connects to
    `address`) unless Ray is already initialised, and shuts down only what it started. `seen` collects the Ray
    tasks and actors that ran the work; each Ray task runs `chunksize` tasks."""
    require_ray()
    import ray
    from ray.util.multiprocessing import Pool

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, num_cpus=workers if address is None else None, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    try:
        with Pool(processes=workers, initializer=initializer, initargs=initargs) as pool:
            for task_id, actor_id, result in pool.imap(_in_ray_context(work), tasks, chunksize=chunksize):
                if seen is not None:
                    if actor_id is None:
                        seen.outside_ray += 1
                    else:
                        seen.actor_ids.add(actor_id)
                    if task_id is not None:
                        seen.task_ids.add(task_id)
                yield result
    finally:
        if started_here:
            ray.shutdown()
