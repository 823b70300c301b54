"""One simulation end to end: build requests, simulate with a progress bar, write the report."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rollflow.sim.config import SimConfig
from rollflow.sim.metrics import request_table, summarize
from rollflow.sim.report import print_summary, write_outputs, write_summary
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests


def run_simulation(config: SimConfig, started_at: float | None = None) -> dict:
    """Simulate `config`, write its output folder, print the summary; return the summary dict.
    rich is imported only for the progress bar on a terminal."""
    started_at = started_at if started_at is not None else time.perf_counter()
    requests = build_requests(config.workload, config.seed)
    simulator = ServingSimulator(config, requests)
    show_progress = config.output.progress and sys.stderr.isatty()
    loop_start = time.perf_counter()
    if show_progress:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("simulating"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as progress:
            task = progress.add_task("simulating", total=len(requests))
            result = simulator.run(on_progress=lambda done: progress.update(task, completed=done))
    else:
        result = simulator.run()
    loop_s = time.perf_counter() - loop_start
    table = request_table(result)
    summary = summarize(result, table, sim_loop_s=loop_s, percentiles=config.output.percentiles)
    summary["setup_s"] = loop_start - started_at  # imports, config, workload and tables
    output_start = time.perf_counter()
    out_dir = Path(config.output.dir)
    output = config.output
    written = write_outputs(
        out_dir,
        table,
        result,
        requests_csv=output.requests_csv,
        chrome_trace=output.chrome_trace,
        plots=output.plots,
    )
    summary["output_s"] = time.perf_counter() - output_start  # requests.csv, chrome trace, plots
    summary["wall_time_s"] = time.perf_counter() - started_at
    written.insert(0, write_summary(out_dir, summary))
    print_summary(summary)
    print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    return summary
