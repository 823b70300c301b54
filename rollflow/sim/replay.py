"""`rollflow sim replay --from-manager-log FILE`: a live run's arrivals through the simulator.

BLIS's observe -> replay -> calibrate loop: the manager's request log (`request_log: PATH`) holds
each sample's arrival, first token and finish as the manager saw them, with its prompt and output
lengths. The finished samples are replayed in the simulator at their recorded arrival offsets,
on the cluster, scheduler and execution profile of a sim config (the engines' profiled tables),
and the simulated TTFT, TPOT and E2E are set beside the recorded ones. The two agree when the
profile and the scheduler model describe the engines; where they do not, the gap says by how much.

The recorded latencies are measured the way the simulator reports them: TTFT from arrival to the
first token, TPOT as (finish - first token) / output tokens, E2E from arrival to finish.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rollflow.errors import UserError
from rollflow.sim.config import SimConfig
from rollflow.sim.metrics import request_table
from rollflow.sim.request import SimRequest
from rollflow.sim.simulator import ServingSimulator

METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (50, 90)


class ManagerLogError(UserError):
    """A request log that cannot be replayed; the message names the file and the line."""


@dataclass(frozen=True)
class LoggedRequest:
    """One finished sample of the manager's log, times in wall-clock seconds."""

    arrived_at: float
    first_token_at: float
    finished_at: float
    prompt_tokens: int
    output_tokens: int
    engine_urls: tuple[str, ...]  # engines that generated its spans, in order


def read_manager_log(path: str | Path) -> tuple[list[LoggedRequest], int]:
    """(finished samples with at least one token, number of other lines skipped)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ManagerLogError(f"--from-manager-log: cannot read {path}: {exc.strerror}") from None
    requests: list[LoggedRequest] = []
    skipped = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if entry["state"] != "finished" or entry["first_token_at"] is None or entry["output_tokens"] < 1:
                skipped += 1
                continue
            requests.append(
                LoggedRequest(
                    float(entry["arrived_at"]),
                    float(entry["first_token_at"]),
                    float(entry["finished_at"]),
                    int(entry["prompt_tokens"]),
                    int(entry["output_tokens"]),
                    tuple(span["engine_url"] for span in entry["spans"]),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ManagerLogError(f"{path}:{number}: not a manager request-log line ({exc!r})") from None
    if not requests:
        raise ManagerLogError(f"{path}: no finished sample to replay ({skipped} other lines)")
    return sorted(requests, key=lambda r: r.arrived_at), skipped


def recorded_latencies(requests: list[LoggedRequest]) -> dict[str, np.ndarray]:
    arrived = np.array([r.arrived_at for r in requests])
    first = np.array([r.first_token_at for r in requests])
    finished = np.array([r.finished_at for r in requests])
    outputs = np.array([r.output_tokens for r in requests])
    return {"ttft": first - arrived, "tpot": (finished - first) / outputs, "e2e": finished - arrived}


def sim_requests(requests: list[LoggedRequest]) -> list[SimRequest]:
    """The log's samples as simulator requests, arriving at their offsets from the first arrival."""
    start = requests[0].arrived_at
    return [
        SimRequest(i, r.arrived_at - start, r.prompt_tokens, r.output_tokens) for i, r in enumerate(requests)
    ]


def _fit_max_tokens(config: SimConfig, requests: list[LoggedRequest]) -> SimConfig:
    """Raise the workload's max_tokens (which sizes KV slots and grids) to the log's longest request."""
    longest = max(r.prompt_tokens + r.output_tokens for r in requests)
    workload = config.workload
    if "max_tokens" not in type(workload).model_fields or workload.max_tokens >= longest:
        return config
    return config.model_copy(update={"workload": workload.model_copy(update={"max_tokens": longest})})


def replay_manager_log(config: SimConfig, path: str | Path) -> dict:
    """Simulate the log's arrivals on `config`'s cluster; return recorded against simulated percentiles."""
    requests, skipped = read_manager_log(path)
    config = _fit_max_tokens(config, requests)
    simulator = ServingSimulator(config, sim_requests(requests))
    result = simulator.run()
    simulated = request_table(result).columns
    recorded = recorded_latencies(requests)
    if len(simulated["ttft"]) != len(requests):
        raise ManagerLogError(
            f"the simulation finished {len(simulated['ttft'])} of {len(requests)} requests "
            "(simulator.time_limit_s too short?)"
        )
    metrics = {}
    for metric in METRICS:
        row = {}
        for q in QUANTILES:
            real = float(np.percentile(recorded[metric], q))
            sim = float(np.percentile(simulated[metric], q))
            diff = (sim - real) / real * 100 if real > 0 else float("nan")
            row[f"p{q}"] = {"recorded": real, "simulated": sim, "diff_pct": diff}
        metrics[metric] = row
    return {
        "log": str(path),
        "num_requests": len(requests),
        "num_skipped": skipped,
        "recorded_engines": sorted({url for r in requests for url in r.engine_urls}),
        "simulated_replicas": len(simulator.replicas),
        "duration_s": requests[-1].arrived_at - requests[0].arrived_at,
        "metrics": metrics,
    }


def format_report(report: dict) -> str:
    """The comparison as a Markdown table, with the counts above it."""
    lines = [
        f"replayed {report['num_requests']} finished samples of {report['log']} "
        f"({report['num_skipped']} other lines skipped) over {report['duration_s']:.2f} s; "
        f"recorded on {len(report['recorded_engines'])} engine(s), "
        f"simulated on {report['simulated_replicas']} replica(s)",
        "",
        "| metric | recorded p50 | simulated p50 | diff | recorded p90 | simulated p90 | diff |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for metric, row in report["metrics"].items():
        cells = []
        for q in QUANTILES:
            cell = row[f"p{q}"]
            cells += [f"{cell['recorded']:.4f}", f"{cell['simulated']:.4f}", f"{cell['diff_pct']:+.1f}%"]
        lines.append(f"| {metric} (s) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(out_dir: str | Path, report: dict) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "replay.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
