"""Where configuration searches run: a local process pool, or Ray tasks (address from RAY_ADDRESS)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


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


def run_with_progress(
    function: Callable[[dict], dict],
    jobs: list[dict[str, Any]],
    backend: str,
    workers: int,
    console: Console,
    noun: str,
    done: int = 0,
) -> Iterator[dict]:
    """`run_jobs` under a "searching <done>/<total> <noun>" bar on a terminal console; `done`: the
    results the search already has (from a cache), counted in the total."""
    with Progress(
        TextColumn("searching"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(noun),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("searching", total=done + len(jobs), completed=done)
        for row in run_jobs(function, jobs, backend, workers):
            yield row
            progress.advance(task)


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
