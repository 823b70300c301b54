"""Which replicas a serving cluster has, and which of them take new work.

`ServingSimulator` and `CompiledCluster` (its public API on the compiled loop) keep their
replicas the same way: a list of `Replica` objects in the order they were added, each with its
membership (kind, accepting, when started and retired), and the ids of the accepting ones cached
for routing. This base holds that bookkeeping once; each simulator adds what its loop needs
(the Python one dispatches its cluster queue, the compiled one tells C).
"""

from __future__ import annotations

from collections.abc import Sequence

from rollflow.policy.view import InstanceKind
from rollflow.sim.build import GroupPlan, check_servable
from rollflow.sim.config import SimConfig
from rollflow.sim.replica import Replica
from rollflow.sim.request import SimRequest


class ReplicaMembership:
    """The replicas of a cluster and their membership; a subclass sets `config`, `replicas`
    (empty) and `_accepting` (None), and keeps `now`."""

    config: SimConfig
    replicas: list[Replica]
    _accepting: list[int] | None  # ids of the accepting replicas; None: changed since last asked
    now: float

    def check_servable(self, requests: Sequence[SimRequest]) -> None:
        """Refuse requests that no replica could ever finish (each replica group checked once)."""
        for replica in {r.predictor: r for r in self.replicas}.values():
            check_servable(requests, replica.scheduler, self.config)

    def accepting_ids(self) -> list[int]:
        """Instances that take new work (cached: routing asks once per request)."""
        if self._accepting is None:
            self._accepting = [r.id for r in self.replicas if r.accepting]
        return self._accepting

    def stop_accepting(self, instance_id: int) -> None:
        """The instance keeps its requests but is no longer routed new ones (a preemption notice)."""
        self.replicas[instance_id].accepting = False
        self._accepting = None

    def close(self) -> None:
        """Every instance still up is let go now (the caller is done with the cluster)."""
        for replica in self.replicas:
            if replica.retired_at is None:
                replica.accepting = False
                replica.retired_at = self.now
        self._accepting = None

    def _add_replica(self, group: GroupPlan, kind: InstanceKind) -> Replica:
        """A new replica of `group`, empty, taking work from now."""
        execution = self.config.execution
        replica = Replica(
            len(self.replicas),
            group.new_scheduler(),
            group.predictor,
            self.config.simulator.fast_forward,
            kind=kind,
            started_at=self.now,
            idle_wakeup_s=execution.idle_wakeup_ms * 1e-3,
            idle_wakeup_ramp_s=execution.idle_wakeup_ramp_ms * 1e-3,
            admission_s=execution.admission_ms * 1e-3,
        )
        self.replicas.append(replica)
        self._accepting = None
        return replica
