"""Replay a Vidur-format trace against a running engine with real arrival times, and read each
request's latencies from its stream: the real side of a simulated-against-real comparison
(`benchmarks/real_engine_fidelity.py`, `benchmarks/gpu/engine_vs_sim.py`, the vLLM tier's test),
and `simulate`, its simulated side, so that every comparison simulates the replay the same way.

Latencies are measured as `rollflow sim serve` writes them to requests.csv: TTFT from sending to
the first token, TPOT (last token - first token) / output tokens, E2E from sending to the last token.
"""

from __future__ import annotations

import asyncio
import csv
import json
import time
from collections.abc import Callable
from pathlib import Path

from rollflow.runtime.engines.profiler.measure import _prompt

METRICS = ("ttft", "tpot", "e2e")


def load_trace(
    path: Path, num_requests: int, max_prompt: int, max_decode: int
) -> list[tuple[float, int, int]]:
    """The first `num_requests` (arrival s, prompt tokens, output tokens) of a Vidur trace, arrivals
    from 0, lengths clipped to [1, max_prompt] and [2, max_decode]."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))[:num_requests]
    first = float(rows[0]["arrived_at"])
    return [
        (
            float(r["arrived_at"]) - first,
            max(1, min(int(r["num_prefill_tokens"]), max_prompt)),
            max(2, min(int(r["num_decode_tokens"]), max_decode)),
        )
        for r in rows
    ]


async def replay(
    kind: str, url: str, requests: list[tuple[float, int, int]], salt: int
) -> list[dict[str, float]]:
    """Send `requests` at their arrival times (greedy, past EOS, so each makes its output length);
    each request's latencies in METRICS. A replay's prompts are its own (seeded from `salt` + index):
    a replay of prompts the engine computed before would find them in its prefix cache, which a
    simulation without prefix caching does not model."""
    from rollflow.runtime.engines.clients import make_client
    from rollflow.runtime.wire.base import SamplingParams

    client = make_client(kind, url)
    start = time.perf_counter() + 0.5

    async def one(index: int, arrival: float, prompt: int, decode: int) -> dict[str, float]:
        await asyncio.sleep(max(0.0, start + arrival - time.perf_counter()))
        sent = time.perf_counter()
        first = last = sent
        count = 0
        sampling = SamplingParams(max_new_tokens=decode, temperature=0.0, ignore_eos=True)
        async for chunk in client.generate(f"replay-{salt}-{index}", _prompt(prompt, salt + index), sampling):
            now = time.perf_counter()
            if chunk.token_ids and count == 0:
                first = now
            count += len(chunk.token_ids)
            last = now
        return {"ttft": first - sent, "tpot": (last - first) / max(count, 1), "e2e": last - sent}

    try:
        return await asyncio.gather(*(one(i, *r) for i, r in enumerate(requests)))
    finally:
        await client.close()


def printed_overrides(profile_stdout: str) -> dict[str, float]:
    """The `execution.KEY=VALUE` simulation overrides `rollflow profile engine` printed (the round
    trip, the wake-up after idle, the admission cost), by key."""
    overrides = {}
    for line in profile_stdout.splitlines():
        if "(simulate it with execution." in line:
            key, value = line.rsplit("execution.", 1)[1].rstrip(")").split("=")
            overrides[key] = float(value)
    return overrides


def write_trace(requests: list[tuple[float, int, int]], path: Path) -> Path:
    """The requests as a Vidur-format trace (`workload.kind: trace` reads it)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        writer.writerows(requests)
    return path


def simulation_config(
    tables: Path,
    model_shape: dict,
    trace: Path,
    round_trip_ms: float,
    max_num_seqs: int,
    max_batched_tokens: int,
    idle_wakeup_ms: float = 0.0,
    admission_ms: float = 0.0,
) -> dict:
    """The `rollflow sim serve` config that simulates a profiled engine as the replayed server ran:
    vLLM's scheduler (chunked prefill at `max_batched_tokens`, at most `max_num_seqs` running) on the
    profile's tables, each request reaching the engine its profiled round trip after it arrives, and
    the first iteration after an idle waiting the profiled wake-up, and an iteration that admits a
    request beside running decodes taking the profiled admission longer."""
    return {
        "cluster": {"model": "profiled", "model_shape": model_shape},
        "scheduler": {"kind": "sarathi", "chunk_size": max_batched_tokens, "batch_size_cap": max_num_seqs},
        "execution": {
            "kind": "tables",
            "compute_table": str(tables / "mlp.csv"),
            "attention_table": str(tables / "attention.csv"),
            "max_batch_size": max_num_seqs,
            "request_overhead_ms": round_trip_ms,
            "idle_wakeup_ms": idle_wakeup_ms,
            "admission_ms": admission_ms,
        },
        "workload": {"kind": "trace", "file": str(trace)},
        "output": {"plots": False, "chrome_trace": False, "progress": False},
    }


def simulate(
    rollflow: Callable[..., object],
    work: Path,
    requests: list[tuple[float, int, int]],
    tables: Path,
    model_shape: dict,
    round_trip_ms: float,
    max_num_seqs: int,
    max_batched_tokens: int,
    overrides: dict[str, float],
) -> list[dict[str, float]]:
    """`rollflow sim serve` of the replayed `requests` on the profiled `tables`, as
    `simulation_config` sets it up (trace, config and output under `work`); each request's latencies
    in METRICS, as `replay` gives the real ones. `rollflow(*args)` runs the CLI and fails when it
    does: a benchmark and a test each have their own way to run it and to fail."""
    trace = write_trace(requests, work / "trace.csv")
    config = simulation_config(
        tables, model_shape, trace, round_trip_ms, max_num_seqs, max_batched_tokens, **overrides
    )
    (work / "sim.yaml").write_text(json.dumps(config))
    rollflow("sim", "serve", "--config", str(work / "sim.yaml"), "--output-dir", str(work / "sim"))
    with (work / "sim" / "requests.csv").open(newline="") as handle:
        return [{m: float(row[m]) for m in METRICS} for row in csv.DictReader(handle)]
