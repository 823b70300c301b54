"""One configuration's search, run in a worker: bisection over `rollflow sim serve` runs.

Each probe is a whole `rollflow sim serve` run (its validated config in, its summary out), so
the search sees exactly what a user reproducing a probe would.
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path
from typing import Any

from rollflow.config import validate_config
from rollflow.plan.bisect import Probe, max_qps
from rollflow.plan.serve_config import SLO, BisectionConfig
from rollflow.plan.space import apply_knobs, unfit_reason


def probe_dir(output_dir: str, key: str, qps: float) -> Path:
    return Path(output_dir) / "runs" / key / f"qps_{qps:g}"


def with_slo_percentiles(raw: dict[str, Any], slos: list[SLO]) -> dict[str, Any]:
    """A run's config that also reports every SLO's percentile (beside its own) in its summary."""
    output = raw.setdefault("output", {})
    wanted = output.get("percentiles", [50.0, 90.0, 99.0])
    output["percentiles"] = sorted({*wanted, *(slo.quantile for slo in slos)})
    return raw


def slo_metrics(summary: dict, slos: list[SLO]) -> dict[str, float]:
    return {slo.name: float(summary[slo.summary_metric][slo.summary_key]) for slo in slos}


def meets(summary: dict, slos: list[SLO]) -> bool:
    """Every SLO holds, and every request completed (a run cut short cannot pass)."""
    if summary["num_completed"] < summary["num_requests"]:
        return False
    return all(slo_metrics(summary, [slo])[slo.name] <= slo.max_s for slo in slos)


def search_configuration(job: dict[str, Any]) -> dict[str, Any]:
    """Find one configuration's max QPS; return its results row (a JSON-ready dict)."""
    from rollflow.sim.config import SimConfig
    from rollflow.sim.runner import run_simulation

    started = time.perf_counter()
    knobs, base, key = job["knobs"], job["base"], job["key"]
    slos = [SLO.model_validate(s) for s in job["slos"]]
    settings = BisectionConfig.model_validate(job["bisection"])
    gpus = knobs["replicas"] * knobs["tensor_parallel"] * knobs["pipeline_stages"]
    cost_per_hour = gpus * job["price"]
    row: dict[str, Any] = {"key": key, **knobs, "gpus": gpus, "cost_per_hour": cost_per_hour}
    reason = unfit_reason(validate_config(SimConfig, apply_knobs(base, knobs, settings.start_qps)))
    if reason is not None:
        return row | _empty(slos) | {"skipped": reason, "simulations": 0, "seconds": 0.0, "probes": []}

    def probe(qps: float) -> Probe:
        raw = with_slo_percentiles(apply_knobs(base, knobs, qps), slos)
        output = raw["output"]
        output.update(
            dir=str(probe_dir(job["output_dir"], key, qps)),
            plots=False,
            chrome_trace=False,
            requests_csv=False,
            progress=False,
        )
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            summary = run_simulation(validate_config(SimConfig, raw))
        return Probe(qps, meets(summary, slos), slo_metrics(summary, slos))

    bracket = max_qps(probe, settings)
    best = bracket.best
    row |= {
        "skipped": None,
        "max_qps": best.qps if best else 0.0,
        "qps_per_dollar": (best.qps if best else 0.0) / cost_per_hour,
        **(best.metrics if best else _empty(slos)),
        "simulations": len(bracket.probes),
        "seconds": round(time.perf_counter() - started, 3),
        "probes": [[p.qps, p.passed] for p in bracket.probes],
    }
    return row


def _empty(slos: list[SLO]) -> dict[str, Any]:
    return {"max_qps": 0.0, "qps_per_dollar": 0.0} | {slo.name: None for slo in slos}
