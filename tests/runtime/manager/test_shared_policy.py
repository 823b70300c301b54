"""One routing policy object decides in the simulator and in the live manager."""

from __future__ import annotations

import asyncio

from rollflow.policy.routing import make_router
from rollflow.runtime.engines.base import SamplingParams
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.service import RolloutManager
from rollflow.sim.engine import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.factories import make_config
from tests.runtime.processes import start_engine


def test_the_same_router_object_routes_a_simulated_and_a_live_cluster(tmp_path, tiny_model):
    router = make_router("round_robin")
    config = make_config(
        "cluster.replicas=3",
        "cluster.router=round_robin",
        "workload.num_requests=7",
        "workload.kind=synthetic",
    )
    ServingSimulator(config, build_requests(config.workload, config.seed), router=router).run()
    engines = [start_engine(tiny_model, tmp_path, name=f"e{i}") for i in range(3)]
    try:

        async def live() -> list[int]:
            manager = RolloutManager(ManagerConfig(), router=router)
            await manager.start()
            try:
                for engine in engines:
                    await manager.add_engine(engine.url)
                batch = manager.submit_batch([[1, 2]] * 6, 1, SamplingParams(max_new_tokens=2, temperature=0))
                while not batch.done:
                    await batch.changed.wait()
                    batch.changed.clear()
                return [sample.spans[0].engine_id for sample in batch.samples]
            finally:
                await manager.close()

        picks = asyncio.run(live())
    finally:
        for engine in engines:
            engine.stop()
    # The simulator routed 7 requests, so the shared cursor continues at 7 % 3 == 1.
    assert picks == [1, 2, 0, 1, 2, 0]
