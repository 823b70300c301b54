"""RLBoost's offload within one step, with every choice of instances made by `OffloadBalancer`.

Local (reserved) instances generate for the balancer's budget from when the step's lanes are free;
then, once a remote instance takes work, they stop and their unfinished sequences move there
(`offload`), and the router picks among remote instances only. Local instances that have nothing
left to generate hand their GPUs to training at once (`release_idle_local`). Which instances are
local (sources) and which take offloaded work (targets) is `OffloadBalancer.offload_sources` and
`offload_targets`, the same two functions the live manager calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollflow.policy.offload import OffloadBalancer
from rollflow.policy.view import ClusterView, InstanceView
from rollflow.sim.events import Event, Phase

if TYPE_CHECKING:
    from rollflow.sim.rl.step import StepSimulator


class StepOffload:
    def __init__(self, step: StepSimulator, balancer: OffloadBalancer | None) -> None:
        """`balancer`: None without preemptible instances (nothing to offload to)."""
        self.step = step
        self.balancer = balancer
        self.offloaded = False
        self.budget_spent = False
        self._local_cache: tuple[int, list[int]] = (-1, [])

    def start(self) -> None:
        """Schedule the end of the step's budget."""
        step, balancer = self.step, self.balancer
        assert balancer is not None, "offload needs a balancer"
        step.emit(step.lanes_free_at + balancer.budget_s, Phase.MOVE, self._on_budget)

    def _on_budget(self, event: Event) -> list[Event]:
        self.budget_spent = True  # (now - start may round below the budget it was scheduled at)
        self._offload()
        return self.step.emitted()

    def on_target_ready(self) -> None:
        """A remote instance joined: offload now if the budget is spent (retried from there)."""
        step, balancer = self.step, self.balancer
        assert balancer is not None, "offload needs a balancer"
        if self.budget_spent or balancer.expired(step.now, step.lanes_free_at):
            self._offload()

    def _offload(self) -> None:
        """Budget spent: local instances stop, their unfinished sequences go to remote ones."""
        if self.offloaded or self.step.progress.rollout_done:
            return
        view = self._cluster_view()
        if not OffloadBalancer.offload_targets(view.instances):
            return  # nowhere to send them: local rollout goes on, retried when an instance arrives
        self._stop_local(OffloadBalancer.offload_sources(view.instances))

    def release_idle_local(self) -> None:
        """Local instances with nothing left to generate hand their GPUs to training at once."""
        if self.offloaded:
            return
        view = self._cluster_view()
        sources = OffloadBalancer.offload_sources(view.instances)
        targets = OffloadBalancer.offload_targets(view.instances)
        if sources and all(s.num_outstanding == 0 for s in sources) and targets:
            self._stop_local(sources)

    def _stop_local(self, sources: list[InstanceView]) -> None:
        """Offloaded: local instances stop, the router sends new work to remote ones only."""
        self.offloaded = True
        self.step.pool.remote_only = True
        for instance in sources:
            self.step.instances.retire(instance.instance_id, "migrate")

    def _cluster_view(self) -> ClusterView:
        """Instances taking work, with their kind, as the offload policy reads them."""
        pool = self.step.pool
        return ClusterView(self.step.now, [pool.view(i) for i in pool.accepting_ids()])

    def targets(self) -> list[int]:
        """Instances a moved sequence may go to now: any that takes work, remote ones once offloaded."""
        pool = self.step.pool
        ids = pool.accepting_ids()
        if pool.remote_only:
            ids = [r.id for r in OffloadBalancer.offload_targets(pool.replicas[i] for i in ids)]
        return ids

    def live_local(self) -> list[int]:
        """Local instances neither retired nor retiring (the same list until the pool's instances change)."""
        pool = self.step.pool
        if self._local_cache[0] != pool.version:
            live = (pool.replicas[i] for i in pool.live_ids())
            self._local_cache = (pool.version, [r.id for r in OffloadBalancer.offload_sources(live)])
        return self._local_cache[1]
