"""The RL simulator and the live manager make their offload choices through the same two functions,
`OffloadBalancer.offload_sources` and `offload_targets`, so they cannot drift apart on which
instances hand work over and which take it."""

from __future__ import annotations

import asyncio
import sys
from collections import defaultdict
from collections.abc import Callable

import pytest

from rollflow.policy.offload import OffloadBalancer
from rollflow.runtime.manager.config import EngineEntry, ManagerConfig
from rollflow.runtime.manager.core.service import RolloutManager
from rollflow.runtime.wire.base import SamplingParams
from rollflow.sim.rl.runner import simulate_steps
from tests.runtime.processes import start_engine
from tests.sim.rl.factories import rl_config

CHOICES = ("offload_sources", "offload_targets")


@pytest.fixture
def callers(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Each offload choice -> the modules that called it, the choices themselves unchanged."""
    seen: dict[str, set[str]] = defaultdict(set)
    for name in CHOICES:
        choice = getattr(OffloadBalancer, name)

        def spy(instances, choice: Callable = choice, name: str = name):
            seen[name].add(sys._getframe(1).f_globals["__name__"])
            return choice(instances)

        monkeypatch.setattr(OffloadBalancer, name, staticmethod(spy))
    return seen


def test_the_simulator_offloads_through_the_balancers_choices(callers):
    config = rl_config("spot.instances=4", "spot.offload.initial_budget_s=5")
    (step,) = simulate_steps(config)
    assert step.num_samples > 0
    assert callers == {name: {"rollflow.sim.rl.offload"} for name in CHOICES}


def test_the_live_manager_offloads_through_the_balancers_choices(callers, tmp_path, tiny_model):
    local = start_engine(tiny_model, tmp_path, name="local", wait=False)
    remote = start_engine(tiny_model, tmp_path, name="remote", wait=False)
    try:
        local.wait_ready()
        remote.wait_ready()
        config = ManagerConfig(
            offload={"enabled": True, "initial_budget_s": 0.5, "min_budget_s": 0.5},
            router="least_outstanding",
            engines=[
                EngineEntry(url=local.url, kind="local", engine_type="builtin", capacity=4),
                EngineEntry(url=remote.url, kind="remote", engine_type="builtin", capacity=1),
            ],
        )

        async def long_batch() -> list[list[int]]:
            manager = RolloutManager(config)
            await manager.start()
            try:
                params = SamplingParams(max_new_tokens=400, temperature=0, ignore_eos=True)
                batch = manager.submit_batch([[3 + i, 1] for i in range(4)], 1, params)
                while not batch.done:
                    await batch.changed()
                return [[span.engine_id for span in sample.spans] for sample in batch.samples]
            finally:
                await manager.close()

        engines_of_samples = asyncio.run(long_batch())
    finally:
        local.stop()
        remote.stop()
    assert any(engines[0] == 0 and engines[-1] == 1 for engines in engines_of_samples), engines_of_samples
    assert callers["offload_sources"] == {"rollflow.runtime.manager.core.offload"}  # the local budgets
    assert callers["offload_targets"] == {
        "rollflow.runtime.manager.core.offload",
        "rollflow.runtime.manager.core.dispatcher",
        "rollflow.runtime.manager.core.fleet",  # a remote engine joined: offloaded batches move to it
    }
