"""Shared factories: small configs that simulate in milliseconds, and paths to Vidur's public data."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, TypeVar

from rollflow.config import apply_override, validate_config
from rollflow.sim.batching import ReplicaScheduler
from rollflow.sim.config import SimConfig
from rollflow.sim.request import SimRequest
from rollflow.sim.simulator import ServingSimulator, SimResult
from rollflow.sim.workload import build_requests

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
VIDUR_DATA = SHARED / "data" / "vidur"
CONV_TRACE = VIDUR_DATA / "processed_traces" / "splitwise_conv.csv"
S = TypeVar("S", bound=ReplicaScheduler)
LLAMA7B_MLP = VIDUR_DATA / "profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"


def make_config(*overrides: str, **sections: Any) -> SimConfig:
    """A SimConfig from keyword sections plus dotted overrides, validated like a user's file."""
    raw: dict[str, Any] = {"output": {"progress": False}, **sections}
    for override in overrides:
        apply_override(raw, override)
    return validate_config(SimConfig, raw)


def simulate(config: SimConfig) -> SimResult:
    return ServingSimulator(config, build_requests(config.workload, config.seed)).run()


def simulate_arrivals(
    arrivals: list[float], prompt_tokens: int, output_tokens: int, *overrides: str
) -> list[SimRequest]:
    """Requests of these lengths arriving at `arrivals` (seconds) on the default one-replica
    cluster with the dotted `overrides`, simulated to the end: their times, in arrival order."""
    config = make_config(*overrides, workload={"kind": "synthetic", "num_requests": 1})
    requests = [SimRequest(i, arrival, prompt_tokens, output_tokens) for i, arrival in enumerate(arrivals)]
    ServingSimulator(config, requests).run()
    return requests


def synthetic_workload(
    num_requests: int, qps: float, max_tokens: int | None = 2048, **lengths: Any
) -> dict[str, Any]:
    """A synthetic workload section: `num_requests` arriving as a Poisson process at `qps`, their
    lengths by `lengths` (`kind="uniform", min_tokens=400, prefill_to_decode_ratio=1.0`, or
    `kind="fixed", prefill_tokens=512, decode_tokens=128`; none: the default lengths)."""
    workload: dict[str, Any] = {
        "kind": "synthetic",
        "num_requests": num_requests,
        "intervals": {"kind": "poisson", "qps": qps},
    }
    if max_tokens is not None:
        workload["max_tokens"] = max_tokens
    if lengths:
        workload["lengths"] = lengths
    return workload


def small_scheduler(cls: type[S], num_blocks: int = 1000, **kwargs: Any) -> S:
    """A replica's batch scheduler of class `cls` on its own: 16-token blocks, at most 8 requests a
    batch, one stage, no watermark; `kwargs` add what `cls` needs (e.g. `chunk_size`)."""
    return cls(
        num_blocks=num_blocks,
        block_size=16,
        batch_size_cap=8,
        num_stages=1,
        watermark_blocks_fraction=0.0,
        **kwargs,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> None:
    """A command refused its input as a user should see it: exit status 2 and one line on stderr
    that holds `expected`."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
