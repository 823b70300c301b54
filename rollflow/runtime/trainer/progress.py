"""A rich progress bar with the last step's figures on a terminal; one plain line per step otherwise."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rollflow.runtime.trainer.metrics import StepMetrics, describe


@contextmanager
def show_progress(total: int, done: int, tty: bool) -> Iterator[Callable[[StepMetrics], None]]:
    if not tty:
        yield lambda metrics: print(describe(metrics), file=sys.stderr, flush=True)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
    ) as progress:
        task = progress.add_task("train", total=total, completed=done, last="")

        def on_step(metrics: StepMetrics) -> None:
            progress.update(task, completed=metrics.step, last=describe(metrics).split(": ", 1)[1])

        yield on_step
