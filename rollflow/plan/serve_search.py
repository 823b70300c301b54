"""`rollflow sim search`: every configuration's max QPS under the SLOs, cached, in parallel."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from rollflow.config import ConfigError, validate_config
from rollflow.plan.backends import run_with_progress
from rollflow.plan.evaluate import search_configuration
from rollflow.plan.serve_config import ServeSearchConfig
from rollflow.plan.serve_report import write_results
from rollflow.plan.space import apply_knobs, config_key, expand

logger = logging.getLogger(__name__)


def check_base(config: ServeSearchConfig) -> None:
    """The base simulation must validate and have a rate the search can set."""
    from rollflow.sim.config import SimConfig

    sim = validate_config(SimConfig, apply_knobs(config.simulation, expand(config.space)[0], 1.0))
    workload = sim.workload
    if workload.kind != "synthetic" or workload.intervals.kind not in ("poisson", "gamma"):
        raise ConfigError(
            "config error: simulation.workload: the search sets the arrival rate, so it needs "
            "kind: synthetic with intervals.kind poisson or gamma (lengths may be kind: trace)"
        )


def run_search(config: ServeSearchConfig, resume: str = "auto", console: Console | None = None) -> list[dict]:
    """Search every configuration (cached ones are read back when `resume` is auto); write outputs."""
    started = time.perf_counter()
    console = console or Console(stderr=True)
    check_base(config)
    out = Path(config.output_dir)
    cache = out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    slos = [s.model_dump() for s in config.slos]
    bisection = config.bisection.model_dump()
    rows: dict[str, dict] = {}
    jobs: list[dict[str, Any]] = []
    for knobs in expand(config.space):
        key = config_key(knobs, config.simulation, slos, bisection)
        cached = cache / f"{key}.json"
        if resume == "auto" and cached.is_file():
            rows[key] = json.loads(cached.read_text())
            continue
        jobs.append(
            {
                "key": key,
                "knobs": knobs,
                "base": config.simulation,
                "slos": slos,
                "bisection": bisection,
                "price": config.prices[knobs["device"]],
                "output_dir": str(out.resolve()),
            }
        )
    total = len(rows) + len(jobs)
    console.print(
        f"{total} configurations: {len(rows)} from cache, {len(jobs)} to search on {config.backend}"
    )
    for row in run_with_progress(
        search_configuration, jobs, config.backend, config.workers, console, "configurations", len(rows)
    ):
        (cache / f"{row['key']}.json").write_text(json.dumps(row))
        rows[row["key"]] = row
    ordered = [rows[config_key(k, config.simulation, slos, bisection)] for k in expand(config.space)]
    searched = {job["key"] for job in jobs}
    simulations = sum(r["simulations"] for r in ordered if r["key"] in searched)
    write_results(out, ordered, config, console)
    console.print(
        f"searched {len(jobs)} configurations on {config.backend} ({simulations} simulations) in "
        f"{time.perf_counter() - started:.1f} s; {total - len(jobs)} read from cache"
    )
    return ordered
