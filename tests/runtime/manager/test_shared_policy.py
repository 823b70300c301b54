"""One routing policy object decides in the simulator and in the live manager."""

from __future__ import annotations

from rollflow.policy.routing import make_router
from rollflow.runtime.manager.config import EngineEntry, ManagerConfig
from rollflow.runtime.wire.base import SamplingParams
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.factories import make_config
from tests.runtime.manager.helpers import finished, run_manager
from tests.runtime.processes import REPO


def test_the_same_router_object_routes_a_simulated_and_a_live_cluster(processes):
    router = make_router("round_robin")
    config = make_config(
        "cluster.replicas=3",
        "cluster.router=round_robin",
        "workload.num_requests=7",
        "workload.kind=synthetic",
    )
    ServingSimulator(config, build_requests(config.workload, config.seed), router=router).run()
    engines = [processes.engine() for _ in range(3)]

    async def live(manager) -> list[int]:
        for engine in engines:
            await manager.fleet.add_engine(EngineEntry(url=engine.url))
        batch = manager.submit_batch([[1, 2]] * 6, 1, SamplingParams(max_new_tokens=2, temperature=0))
        await finished(batch)
        return [sample.spans[0].engine_id for sample in batch.samples]

    picks = run_manager(live, router=router)
    # The simulator routed 7 requests, so the shared cursor continues at 7 % 3 == 1.
    assert picks == [1, 2, 0, 1, 2, 0]


class RecordingRouter:
    """Passes decisions through and keeps what the router saw, to replay them elsewhere."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.decisions: list[tuple] = []

    def pick(self, request, view):
        choice = self.inner.pick(request, view)
        self.decisions.append((request, view, choice))
        return choice


def test_one_learned_policy_file_routes_the_simulator_and_the_live_manager(processes):
    policy = str(REPO / "examples/router/homogeneous.policy.npz")
    config = make_config(
        "cluster.replicas=4",
        "cluster.router=learned",
        f"cluster.router_path={policy}",
        "workload.kind=synthetic",
        "workload.num_requests=60",
    )
    simulated = ServingSimulator(config, build_requests(config.workload, config.seed))
    simulated.router = RecordingRouter(simulated.router)
    simulated.run()
    assert len({choice for _, _, choice in simulated.router.decisions}) >= 2

    engines = [processes.engine() for _ in range(4)]

    async def live(manager) -> RecordingRouter:
        manager.dispatcher.router = RecordingRouter(manager.dispatcher.router)  # before any request
        for engine in engines:
            await manager.fleet.add_engine(EngineEntry(url=engine.url))
        batch = manager.submit_batch([[3, 4, 5]] * 12, 1, SamplingParams(max_new_tokens=3, temperature=0))
        await finished(batch)
        assert all(sample.state.name == "FINISHED" for sample in batch.samples)
        return manager.dispatcher.router

    recorded = run_manager(live, ManagerConfig(router="learned", router_path=policy))
    fresh = make_router("learned", path=policy)
    assert len(recorded.decisions) == 12
    assert [fresh.pick(request, view) for request, view, _ in recorded.decisions] == [
        choice for _, _, choice in recorded.decisions
    ]
