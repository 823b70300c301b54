"""The prefix-routing examples: what each router gives on GRPO groups, agent sessions and the
thrash case, compared in-process from the shipped configs (the README table's claims)."""

import pytest

from rollflow.config import load_config
from rollflow.sim.config import SimConfig
from rollflow.sim.metrics import request_table, summarize
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.factories import REPO

THRASH = [
    "scheduler.num_blocks=1500",
    "workload.num_requests=40",
    "workload.intervals.qps=10",
    "workload.sessions.turns=16",
    "workload.sessions.think_time_s=4",
    "workload.sessions.turn_tokens=64",
    "workload.lengths.decode_tokens=64",
]


def _summaries(example, routers, overrides=()):
    summaries = {}
    for router in routers:
        config = load_config(
            SimConfig, REPO / "examples" / "sim" / example, [f"cluster.router={router}", *overrides]
        )
        result = ServingSimulator(config, build_requests(config.workload, config.seed)).run()
        summary = summarize(result, request_table(result), 1.0)
        assert summary["num_completed"] == summary["num_requests"]
        summaries[router] = summary
    return summaries


def _balanced(summary, tolerance=0.1):
    counts = [replica["num_requests"] for replica in summary["replicas"]]
    mean = sum(counts) / len(counts)
    return max(counts) <= (1 + tolerance) * mean and min(counts) >= (1 - tolerance) * mean


@pytest.mark.parametrize(
    ("example", "router"), [("grpo_prefix.yaml", "prefix_affinity"), ("agent_sessions.yaml", "session")]
)
def test_affinity_caches_computes_half_and_answers_faster_than_lor(example, router):
    runs = _summaries(example, ["round_robin", "lor", router])
    affine, lor = runs[router], runs["lor"]
    assert affine["prefix_hit_rate"] >= 0.8
    assert affine["prefill_tokens_computed"] <= lor["prefill_tokens_computed"] / 2
    assert affine["prefill_tokens_computed"] <= runs["round_robin"]["prefill_tokens_computed"] / 2
    assert affine["ttft"]["p50"] < lor["ttft"]["p50"]
    assert _balanced(affine)


def test_prefix_affinity_serves_sessions_as_well():
    runs = _summaries("agent_sessions.yaml", ["lor", "prefix_affinity"])
    assert runs["prefix_affinity"]["prefix_hit_rate"] >= 0.8
    assert runs["prefix_affinity"]["prefill_tokens_computed"] <= runs["lor"]["prefill_tokens_computed"] / 2


def test_consistent_hashing_thrashes_where_affinity_keeps_its_hit_rate_and_balance():
    runs = _summaries("agent_sessions.yaml", ["prefix_affinity", "consistent_hash"], THRASH)
    affine, hashed = runs["prefix_affinity"], runs["consistent_hash"]
    assert affine["prefix_hit_rate"] >= 0.9 and _balanced(affine, 0.05)
    assert hashed["prefix_hit_rate"] <= affine["prefix_hit_rate"] - 0.1
    assert hashed["prefill_tokens_computed"] >= 2 * affine["prefill_tokens_computed"]
    assert hashed["ttft"]["p99"] > 3 * affine["ttft"]["p99"]
    assert not _balanced(hashed)
