"""`fastdata convert ... --engine ray`: verify and encode the source images on a Ray cluster (a local Ray
instance when no address is given), `pip install 'fastdata[ray]'`.

The Ray workers run the same per-file task as the local process pool, results come back in task order and the
driver writes them, checkpoints included, exactly as a local conversion does: the dataset is the same (same
samples, labels, manifest counts; byte-identical WebDataset shards) and an interrupted Ray conversion resumes
with either engine. On a cluster every node must read the source tree at the same path (a shared file system)
and have fastdata installed.
"""

from __future__ import annotations

from collections import deque
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


class _RayWorker:
    """A Ray actor that runs the conversion's work: set up once (`initializer(*initargs)`, the job arriving once
    through Ray's object store), then given tasks."""

    def __init__(self, initializer: Callable[..., None], initargs: tuple) -> None:
        initializer(*initargs)

    def run(self, work: Callable[[Any], Any], task: Any) -> tuple[str | None, str | None, Any]:
        """`work(task)`, with the Ray task and actor that ran it."""
        import ray

        context = ray.get_runtime_context()
        return context.get_task_id(), context.get_actor_id(), work(task)


def require_ray() -> None:
    """Raise ConfigError (before anything is written) when Ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"--engine ray needs Ray: pip install 'fastdata[ray]' ({exc})") from None


def ray_results(work: Callable[[Any], Any], tasks: list[Any], workers: int | None, address: str | None,
                initializer: Callable[..., None], seen: RayWork | None = None, initargs: tuple = (),
                in_flight: int = 2) -> Iterator[Any]:
    """`work(task)` for every task, in task order, on `workers` Ray actors (None: one per CPU of the cluster),
    each set up once by `initializer(*initargs)`. Tasks go round-robin to the actors, `in_flight` per actor at
    most, so that each has its next task queued while it runs one and the driver holds few results. Starts a
    local Ray instance (or connects to `address`) unless Ray is already initialised, and shuts down only what it
    started. `seen` collects the Ray tasks and actors that ran the work."""
    require_ray()
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, num_cpus=workers if address is None else None, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    actors: list[Any] = []
    try:
        count = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        shared = ray.put(initargs)  # once into the object store, read by every actor
        actor = ray.remote(num_cpus=1)(_RayWorker)
        actors = [actor.remote(initializer, shared) for _ in range(min(count, max(1, len(tasks))))]
        pending: deque[Any] = deque()
        submitted = 0

        def submit() -> None:
            nonlocal submitted
            pending.append(actors[submitted % len(actors)].run.remote(work, tasks[submitted]))
            submitted += 1

        while submitted < min(len(tasks), in_flight * len(actors)):
            submit()
        while pending:
            task_id, actor_id, result = ray.get(pending.popleft())
            if submitted < len(tasks):
                submit()
            if seen is not None:
                if actor_id is None:
                    seen.outside_ray += 1
                else:
                    seen.actor_ids.add(actor_id)
                if task_id is not None:
                    seen.task_ids.add(task_id)
            yield result
    finally:
        for each in actors:
            ray.kill(each)
        if started_here:
            ray.shutdown()
