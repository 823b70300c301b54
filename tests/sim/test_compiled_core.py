"""Simulations on the compiled core (execution-time lookups and the serving loop) match the
pure-Python reference exactly: per-request times, replica totals, the event count."""

import pytest

from rollflow.native import PURE_PYTHON_ENV
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.compiled import require_compiled
from tests.factories import CONV_TRACE, make_config, simulate, synthetic_workload


@pytest.fixture(autouse=True)
def timing_core() -> None:
    """Every test here compares the compiled lookups with the reference: they must be built."""
    require_compiled("rollflow.perf._timing")


def _per_request(result):
    return [
        (r.id, r.replica_id, r.scheduled_at, r.prefill_completed_at, r.completed_at, r.num_restarts)
        for r in result.requests
    ]


def _replica_totals(result):
    return [
        (
            replica.stats.batches,
            replica.stats.kv_samples,
            replica.stats.busy_s,
            replica.stats.flops,
            replica.stats.num_iterations,
            replica.stats.decode_tokens,
            replica.tokens_per_s,
            replica.scheduler.num_preemptions,
            replica.scheduler.num_allocated_blocks,
            replica.scheduler.resident_remaining_tokens,
        )
        for replica in result.replicas
    ]


def _run_both(monkeypatch, config, loop_compiled=True):
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    pure = simulate(config)
    monkeypatch.delenv(PURE_PYTHON_ENV)
    compiled = simulate(config)
    assert compiled.replicas[0].predictor.compiled and not pure.replicas[0].predictor.compiled
    assert not pure.compiled_loop
    if loop_compiled:  # the configuration is one the C loop covers: it must have run it
        require_compiled("rollflow.sim._loop")
    assert compiled.compiled_loop == loop_compiled
    assert (compiled.simulated_time_s, compiled.num_events) == (pure.simulated_time_s, pure.num_events)
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
    # the loop is compiled for vllm and sarathi on one stage; orca and pipelines run the Python loop
    pure, compiled = _run_both(monkeypatch, config, loop_compiled=kind != "orca" and stages == 1)
    assert _per_request(compiled) == _per_request(pure)  # exact: no tolerance
    for a, b in zip(compiled.replicas, pure.replicas, strict=True):
        assert a.stats.batches == b.stats.batches
        assert a.stats.flops == b.stats.flops


def test_compiled_core_is_exact_under_memory_pressure_and_gqa(monkeypatch):
    config = make_config(
        cluster={"model": "meta-llama/Meta-Llama-3-8B"},
        scheduler={"kind": "sarathi", "num_blocks": 300, "chunk_size": 256},
        workload=synthetic_workload(200, 40, kind="uniform", min_tokens=400, prefill_to_decode_ratio=1.0),
    )
    pure, compiled = _run_both(monkeypatch, config)
    assert sum(r.num_restarts for r in pure.requests) > 0, "the workload must force preemptions"
    assert _per_request(compiled) == _per_request(pure)


@pytest.mark.parametrize("kind", ["vllm", "sarathi"])
@pytest.mark.parametrize("router", ["round_robin", "lor", "random"])
@pytest.mark.parametrize("dispatch", ["on_arrival", "late_binding"])
def test_compiled_loop_matches_under_preemption_wakeup_admission_and_overhead(
    monkeypatch, kind, router, dispatch
):
    """Everything the loop models at once: routers that read the load (each arrival's snapshot is
    built in C) or only ids, routing on arrival or from the cluster queue, recompute preemptions,
    idle wake-ups, admission costs, the request overhead, and decode runs cut by arrivals."""
    config = make_config(
        f"cluster.dispatch={dispatch}",
        "cluster.capacity=6",
        "execution.idle_wakeup_ms=3",
        "execution.idle_wakeup_ramp_ms=20",
        "execution.admission_ms=0.7",
        "execution.request_overhead_ms=1.5",
        cluster={"replicas": 3, "router": router},
        scheduler={"kind": kind, "num_blocks": 400, "chunk_size": 256},
        workload=synthetic_workload(300, 25, kind="uniform", min_tokens=200, prefill_to_decode_ratio=2.0),
    )
    pure, compiled = _run_both(monkeypatch, config)
    assert sum(r.num_restarts for r in pure.requests) > 0, "the workload must force preemptions"
    assert sum(b[5] > 1 for replica in pure.replicas for b in replica.stats.batches), "and decode runs"
    assert _per_request(compiled) == _per_request(pure)
    assert _replica_totals(compiled) == _replica_totals(pure)


@pytest.mark.parametrize("dispatch", ["on_arrival", "late_binding"])
def test_compiled_loop_stops_at_the_time_limit_as_the_python_loop_does(monkeypatch, dispatch):
    config = make_config(
        "simulator.time_limit_s=4",
        f"cluster.dispatch={dispatch}",
        "cluster.capacity=8",
        cluster={"replicas": 2, "router": "least_tokens"},
        scheduler={"kind": "sarathi"},
        workload={"kind": "synthetic", "num_requests": 400, "intervals": {"kind": "poisson", "qps": 60}},
    )
    pure, compiled = _run_both(monkeypatch, config)
    assert any(r.completed_at is None for r in pure.requests), "the limit must cut the run"
    if dispatch == "late_binding":  # and leave requests in the cluster queue, never routed
        assert any(r.replica_id == -1 for r in pure.requests)
    assert _per_request(compiled) == _per_request(pure)
    assert _replica_totals(compiled) == _replica_totals(pure)


def test_compiled_loop_reports_progress_as_the_python_loop_does(monkeypatch):
    """The progress bar hears the same completion counts from both loops."""
    require_compiled("rollflow.sim._loop")
    config = make_config(
        scheduler={"kind": "sarathi"},
        workload={"kind": "synthetic", "num_requests": 600},
        cluster={"replicas": 2},
    )
    calls: dict[str, list[int]] = {"python": [], "compiled": []}
    for loop in calls:
        if loop == "python":
            monkeypatch.setenv(PURE_PYTHON_ENV, "1")
        else:
            monkeypatch.delenv(PURE_PYTHON_ENV)
        simulator = ServingSimulator(config, build_requests(config.workload, config.seed))
        assert simulator.run(on_progress=calls[loop].append).compiled_loop == (loop == "compiled")
    assert len(calls["python"]) > 100 and calls["python"][-1] == 600
    assert calls["compiled"] == calls["python"]
