"""Where configuration searches run: a local process pool, or Ray tasks (address from RAY_ADDRESS)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any


def run_jobs(
    function: Callable[[dict], dict], jobs: list[dict[str, Any]], backend: str, workers: int
) -> Iterator[dict]:
    """Yield `function(job)` for every job, as each finishes."""
    if not jobs:
        return
    if backend == "ray":
        yield from _ray(function, jobs)
        return
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = [pool.submit(function, job) for job in jobs]
        for future in as_completed(futures):
            yield future.result()


def _ray(function: Callable[[dict], dict], jobs: list[dict[str, Any]]) -> Iterator[dict]:
    """One Ray task per configuration on the cluster at RAY_ADDRESS (a local one when unset)."""
    import ray

    from rollflow.ray_cluster import init_ray

    started_here = not ray.is_initialized()
    if started_here:
        init_ray(None, "RAY_ADDRESS", "drop --backend ray to search on this machine", log_to_driver=False)
    try:
        remote = ray.remote(function)
        pending = [remote.remote(job) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started_here:
            ray.shutdown()
