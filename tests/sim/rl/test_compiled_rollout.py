"""The RL step's rollout on the compiled core (`rollflow.sim.compiled_cluster`) matches its
pure-Python twin exactly on every shipped RL example and each of its `compare` variants, with
a manager whose relay holds the rollout back, with partial rollout under dynamic scheduling, and
with spot lives short enough that no instance takes work for a while: every sample's times, every
instance's batches and life, the event count, the run's summary."""

from pathlib import Path

import pytest
import yaml

from rollflow.config import load_config
from rollflow.native import PURE_PYTHON_ENV
from rollflow.sim.compiled_cluster import CompiledCluster
from rollflow.sim.rl import step as step_module
from rollflow.sim.rl.accounting import summarize_run
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.runner import simulate_steps
from rollflow.sim.simulator import ServingSimulator

pytest.importorskip("rollflow.sim._loop", reason="compiled loop not built (make compiled)")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "rl"
MEASURED = ("wall_time_s", "peak_memory_mib")  # of the process, not of the simulation


def _cases() -> list:
    cases = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        variants = yaml.safe_load(path.read_text()).get("compare") or [{"name": "as-is", "overrides": []}]
        cases += [pytest.param(path, v["overrides"], id=f"{path.stem}-{v['name']}") for v in variants]
    # a manager that holds the rollout back: deliveries, not generation, drive the step's decisions
    bound = ["manager.processes=1", "manager.cpu_us_per_token=50"]
    cases.append(pytest.param(EXAMPLES / "rlinf_dynamic.yaml", bound, id="rlinf_dynamic-manager-bound"))
    # partial rollout with dynamic scheduling: released instances hand samples on, the full batch stops the rest
    partial = ["partial_rollout=16", "scheduling.pre_process=true", "off_policy=1"]
    cases.append(pytest.param(EXAMPLES / "rlinf_dynamic.yaml", partial, id="rlinf_dynamic-partial-rollout"))
    # spot lives so short that, off-policy, every preemptible instance is past its notice while the
    # local ones wait for the previous step's lanes: the held samples wait for an instance to join
    short = ["spot.availability.mean_lifetime_s=40", "spot.on_preemption=restart", "off_policy=1"]
    cases.append(pytest.param(EXAMPLES / "rlboost_spot.yaml", short, id="rlboost_spot-short-lives-held"))
    return cases


def _simulate(monkeypatch, path: Path, overrides: list[str]):
    """The run's summary and, per step, what its rollout did."""
    config = load_config(RLSimConfig, str(path), [*overrides, "output.gantt=false"])
    stepped = []
    run = step_module.StepSimulator.run

    def recording(self):
        stepped.append(self)
        return run(self)

    monkeypatch.setattr(step_module.StepSimulator, "run", recording)
    summary = summarize_run(config, simulate_steps(config), 0.0)
    for key in MEASURED:
        summary.pop(key)
    rollouts = [
        (
            type(step.pool.sim),
            step.pool.sim.num_events,
            [_sample(r) for r in step.progress.requests],
            [_instance(replica) for replica in step.pool.replicas],
        )
        for step in stepped
    ]
    return summary, rollouts


def _sample(r) -> tuple:
    times = (r.scheduled_at, r.prefill_completed_at, r.completed_at)
    return (r.id, r.replica_id, *times, r.num_restarts, r.processed, r.num_prefill, r.num_decode, r.blocks)


def _instance(replica) -> tuple:
    stats = replica.stats
    life = (replica.kind, replica.started_at, replica.retired_at)
    return (
        *life,
        stats.batches,
        stats.kv_samples,
        stats.busy_s,
        stats.flops,
        stats.decode_tokens,
        replica.tokens_per_s,
    )


@pytest.mark.parametrize(("path", "overrides"), _cases())
def test_compiled_rollout_matches_the_python_twin_on_the_shipped_examples(monkeypatch, path, overrides):
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    pure_summary, pure = _simulate(monkeypatch, path, overrides)
    monkeypatch.delenv(PURE_PYTHON_ENV)
    compiled_summary, compiled = _simulate(monkeypatch, path, overrides)
    assert {kind for kind, *_ in pure} == {ServingSimulator}
    assert {kind for kind, *_ in compiled} == {CompiledCluster}  # it ran, not the fallback
    for (_, *python_step), (_, *compiled_step) in zip(pure, compiled, strict=True):
        events, samples, instances = python_step
        assert compiled_step[0] == events
        assert compiled_step[1] == samples  # exact: no tolerance
        assert compiled_step[2] == instances
    assert compiled_summary == pure_summary
