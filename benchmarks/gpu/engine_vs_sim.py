"""Stage 2: the built-in engine on the device, profiled with `rollflow profile engine`, then the
first requests of Vidur's Splitwise conversation trace replayed against it at two loads (fractions
of the capacity the profile measured) and simulated by `rollflow sim serve` on the profiled tables:
TTFT, TPOT and E2E at p50 and p90, simulated against measured.

The method is benchmarks/real_engine_fidelity.py's (there against vLLM's CPU server): the replay
sends each request at its arrival time with its own prompt (no prefix-cache hits the simulation
would not model), and the simulation gets the profile's round trip, idle wake-up and admission cost."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import numpy as np

from benchmarks.gpu.common import Budget, Fleet, Settings, StageFailed
from benchmarks.results import Results
from rollflow.perf.profile.hf_config import load_model_config, model_shape_section
from rollflow.runtime.deadline import within
from rollflow.runtime.engines.profiler.trace_replay import (
    METRICS,
    load_trace,
    printed_overrides,
    replay,
    simulate,
)

TRACE = Path("processed_traces/splitwise_conv.csv")
REPLAY_SALTS = itertools.count(10**6, 10**3)  # each replay's prompts are its own
# The simulated p50 within this fraction of the measured one, judged on a GPU only (a shared CPU's
# speed drifts more than that between the profile and the replay).
MAX_P50_ERROR = 0.25


def profile(
    url: str, model: Path, tables: Path, settings: Settings, budget: Budget
) -> tuple[float, float, dict]:
    """(round trip ms, decode iteration s at the engine's full batch, the other printed overrides)."""
    out = budget.rollflow(
        "profile", "engine", "--url", url, "--kind", "builtin", "--model-config", str(model),
        "--out", str(tables), *settings.profile_engine_args,
    )  # fmt: skip
    overrides = printed_overrides(out)
    round_trip_ms = overrides.pop("request_overhead_ms")
    batch = settings.max_running
    line = next((x for x in out.splitlines() if x.startswith(f"decode batch {batch}, KV ")), None)
    if line is None:
        raise StageFailed(f"`rollflow profile engine` printed no decode batch {batch}:\n{out[-1000:]}")
    return round_trip_ms, float(line.split()[5]) * 1e-3, overrides


def run(
    settings: Settings, fleet: Fleet, vidur_data: Path, work: Path, budget: Budget, results: Results
) -> None:
    url, model = fleet.engines[0].url, fleet.model
    if not (vidur_data / TRACE).is_file():
        raise StageFailed(f"the Splitwise trace is not at {vidur_data / TRACE} (see --vidur-data)")
    round_trip_ms, iteration_s, overrides = profile(url, model, work / "tables", settings, budget)
    base = load_trace(vidur_data / TRACE, settings.num_requests, settings.max_prompt, settings.max_decode)
    mean_decode = float(np.mean([d for _, _, d in base]))
    capacity_qps = settings.max_running / iteration_s / mean_decode
    native_qps = (len(base) - 1) / (base[-1][0] - base[0][0])
    results.figures["profile"] = {
        "round_trip_ms": round_trip_ms,
        f"decode_iteration_ms_at_batch_{settings.max_running}": iteration_s * 1e3,
        "capacity_requests_per_s": capacity_qps,
        **overrides,
    }
    print(f"  profiled: round trip {round_trip_ms:.2f} ms, batch-{settings.max_running} decode iteration "
          f"{iteration_s * 1e3:.1f} ms, capacity about {capacity_qps:.2f} requests/s")  # fmt: skip
    rows, per_load = [], {}
    for load in settings.loads:
        requests = [(a * native_qps / (load * capacity_qps), p, d) for a, p, d in base]
        measured_rows = asyncio.run(
            within(replay("builtin", url, requests, salt=next(REPLAY_SALTS)), budget.left())
        )
        measured = {m: np.array([r[m] for r in measured_rows]) for m in METRICS}
        load_dir = work / f"load{load}"
        load_dir.mkdir()
        simulated_rows = simulate(
            budget.rollflow,
            load_dir,
            requests,
            work / "tables",
            model_shape_section(load_model_config(model)),
            round_trip_ms,
            settings.max_running,
            settings.max_prompt,
            overrides,
        )
        simulated = {m: np.array([r[m] for r in simulated_rows]) for m in METRICS}
        per_load[f"{load:g}"] = figures = {}
        for metric in METRICS:
            for q in (50, 90):
                real, sim = (
                    float(np.percentile(measured[metric], q)),
                    float(np.percentile(simulated[metric], q)),
                )
                error = (sim - real) / real
                figures[f"{metric}_p{q}"] = {"measured_s": real, "simulated_s": sim, "error": error}
                rows.append([f"{load:.0%}", metric, f"p{q}", round(real, 5), round(sim, 5), f"{error:+.1%}"])
        print(f"  load {load:.0%}: " + ", ".join(
            f"{m} p50 {figures[m + '_p50']['measured_s'] * 1e3:.1f} ms measured, "
            f"{figures[m + '_p50']['simulated_s'] * 1e3:.1f} simulated" for m in METRICS))  # fmt: skip
        results.goal(f"requests answered at {load:.0%} load", len(measured_rows), ">=", len(requests))
        if settings.device.startswith("cuda"):
            for metric in ("tpot", "e2e"):
                error = abs(figures[f"{metric}_p50"]["error"])
                results.goal(f"|sim - measured| / measured, {metric} p50 at {load:.0%} load", error, "<=",
                             MAX_P50_ERROR, headline=metric == "e2e")  # fmt: skip
    results.figures["loads"] = per_load
    results.table(
        "Built-in engine on the device: measured vs rollflow sim (seconds)",
        ["load", "metric", "quantile", "measured", "simulated", "sim error"],
        rows,
    )
