"""Simulations on the compiled execution-time lookups match the pure-Python reference exactly."""

import pytest

from rollflow.perf.predictor import PURE_PYTHON_ENV
from tests.factories import CONV_TRACE, make_config, simulate

pytest.importorskip("rollflow.perf._timing", reason="compiled core not built (make compiled)")


def _per_request(result):
    return [
        (r.id, r.replica_id, r.scheduled_at, r.prefill_completed_at, r.completed_at, r.num_restarts)
        for r in result.requests
    ]


def _run_both(monkeypatch, config):
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    pure = simulate(config)
    monkeypatch.delenv(PURE_PYTHON_ENV)
    compiled = simulate(config)
    assert compiled.replicas[0].predictor.compiled and not pure.replicas[0].predictor.compiled
    return pure, compiled


@pytest.mark.parametrize("kind", ["vllm", "sarathi", "orca"])
@pytest.mark.parametrize("stages", [1, 2])
def test_compiled_core_gives_identical_per_request_times(monkeypatch, kind, stages):
    if not CONV_TRACE.is_file():
        pytest.skip("needs ../shared/data/vidur")
    config = make_config(
        cluster={"replicas": 2, "router": "least_tokens", "pipeline_stages": stages},
        scheduler={"kind": kind},
        workload={"kind": "trace", "file": str(CONV_TRACE), "num_requests": 800, "time_scale": 0.2},
    )
    pure, compiled = _run_both(monkeypatch, config)
    assert _per_request(compiled) == _per_request(pure)  # exact: no tolerance
    for a, b in zip(compiled.replicas, pure.replicas, strict=True):
        assert a.stats.batches == b.stats.batches
        assert a.stats.flops == b.stats.flops


def test_compiled_core_is_exact_under_memory_pressure_and_gqa(monkeypatch):
    config = make_config(
        cluster={"model": "meta-llama/Meta-Llama-3-8B"},
        scheduler={"kind": "sarathi", "num_blocks": 300, "chunk_size": 256},
        workload={
            "kind": "synthetic",
            "num_requests": 200,
            "max_tokens": 2048,
            "lengths": {"kind": "uniform", "min_tokens": 400, "prefill_to_decode_ratio": 1.0},
            "intervals": {"kind": "poisson", "qps": 40},
        },
    )
    pure, compiled = _run_both(monkeypatch, config)
    assert sum(r.num_restarts for r in pure.requests) > 0, "the workload must force preemptions"
    assert _per_request(compiled) == _per_request(pure)
