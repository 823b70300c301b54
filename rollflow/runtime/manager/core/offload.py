"""Offload's part of the live manager: each batch's local budget, set from the trainer's step
reports by the `OffloadBalancer` (the same one the RL simulator runs), and the move of a batch's
samples from local engines to remote ones once its budget runs out or a remote engine joins while it
has. The manager keeps the samples' lives; this part says which of them move and when.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from rollflow.policy.offload import OffloadBalancer, StepReport
from rollflow.runtime.manager.core.samples import SampleState
from rollflow.runtime.manager.durability.journal_events import NoJournal

if TYPE_CHECKING:
    from rollflow.runtime.manager.config import ManagerConfig
    from rollflow.runtime.manager.core.batches import Batch, BatchBook
    from rollflow.runtime.manager.core.registry import Registry

log = logging.getLogger(__name__)


class LocalBudgets:
    """The trainer's step reports, the balancer they feed, and the batches' local budgets."""

    def __init__(
        self,
        config: ManagerConfig,
        registry: Registry,
        batches: BatchBook,
        move: Callable[[str, str], None],
        wake: Callable[[], None],
    ) -> None:
        """`move(sample_id, reason)` ends a running attempt so its sample resumes elsewhere;
        `wake()` has the dispatcher try its queue again."""
        self.balancer = OffloadBalancer(config.offload.settings()) if config.offload.enabled else None
        self.num_step_reports = 0
        self.last_step_report: dict | None = None  # what the trainer reported last
        self.journal: NoJournal = NoJournal()  # the manager's (`use_journal`): step reports are journaled
        self._registry = registry
        self._batches = batches
        self._move = move
        self._wake = wake

    @property
    def budget_s(self) -> float | None:
        """A new batch's local budget; None with offload off."""
        return self.balancer.budget_s if self.balancer is not None else None

    def run_out(self, batch: Batch, after_s: float) -> None:
        """Run the batch's budget out `after_s` from now."""
        asyncio.get_running_loop().call_later(max(0.0, after_s), self._expire, batch)

    def report_step(
        self, step_time_s: float, bubble_s: float, rollout_s: float | None = None
    ) -> float | None:
        """The trainer's measurement of one step; returns the next local budget (None if offload is off)."""
        self.num_step_reports += 1
        self.last_step_report = {"step_time_s": step_time_s, "bubble_s": bubble_s, "rollout_s": rollout_s}
        budget = (
            self.balancer.update(StepReport(step_time_s, bubble_s)) if self.balancer is not None else None
        )
        self.journal.set_state("step_reports", self.state())
        return budget

    def state(self) -> dict:
        """What a restarted manager needs back (`load_state`)."""
        return {
            "num_step_reports": self.num_step_reports,
            "last_step_report": self.last_step_report,
            "balancer": self.balancer.state() if self.balancer is not None else None,
        }

    def load_state(self, state: dict) -> None:
        self.num_step_reports = state["num_step_reports"]
        self.last_step_report = state["last_step_report"]
        if self.balancer is not None and state["balancer"] is not None:
            self.balancer.load_state(state["balancer"])

    def remote_engine_joined(self) -> None:
        """A remote engine joined: the batches past their budget move their local samples to it."""
        for batch in self._batches:
            if batch.offloaded:
                self._move_local_samples(batch)

    def _expire(self, batch: Batch) -> None:
        if self._batches.get(batch.batch_id) is not batch or batch.done:
            return
        batch.offloaded = True
        self.journal.batch_offloaded(batch.batch_id)
        log.info("batch %s: local budget of %.2fs expired", batch.batch_id, batch.budget_s)
        self._move_local_samples(batch)
        self._wake()

    def _move_local_samples(self, batch: Batch) -> None:
        if not OffloadBalancer.offload_targets(self._registry.live()):
            return  # nowhere to offload to; local engines keep going
        sources = {e.engine_id for e in OffloadBalancer.offload_sources(self._registry.all())}
        for sample in batch.samples:
            if sample.state == SampleState.RUNNING and sample.engine_id in sources:
                self._move(sample.sample_id, "offloaded")
