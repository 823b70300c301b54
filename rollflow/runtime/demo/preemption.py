"""Kill an engine mid-rollout, as a spot provider would, and start its replacement.

The preemptor is the only thread that touches the Launcher while the trainer runs in the
main thread: it deregisters exited engines, kills the chosen engine once it is streaming
half-done samples of the chosen step, and starts a new engine from the same pool, which pulls
the newest weights and registers itself. Nothing here tells the manager or the trainer what
happened: they have to find out, which is the point of the demo.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rollflow.runtime.demo.config import PreemptionSection
from rollflow.runtime.demo.timeline import Timeline
from rollflow.runtime.launch.config import EnginePool
from rollflow.runtime.launch.launcher import Launcher

TICK_S = 0.05


class Preemptor(threading.Thread):
    def __init__(
        self,
        launch: Launcher,
        pool: EnginePool,
        settings: PreemptionSection,
        step_in_progress: Callable[[], int],
        timeline: Timeline,
    ) -> None:
        super().__init__(name="preemptor", daemon=True)
        self.launch = launch
        self.pool = pool
        self.settings = settings
        self.step_in_progress = step_in_progress
        self.timeline = timeline
        self.preempted: list[int] = []
        self.error: BaseException | None = None
        self._tokens_at_step_start: int | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.wait(TICK_S):
                self.launch.check_processes()
                if not self.preempted and self.step_in_progress() == self.settings.step:
                    self._maybe_preempt()
        except BaseException as exc:  # the main thread re-raises it after the trainer stops
            self.error = exc

    def stop(self) -> None:
        """Stop the thread; raises what it failed with, if anything."""
        self._stop_event.set()
        self.join()
        if self.error is not None:
            raise self.error

    def _maybe_preempt(self) -> None:
        target = next((e for e in self.launch.engines.values() if e.pool is self.pool), None)
        if target is None:
            return
        worker = next((w for w in self.launch.manager.workers() if w["id"] == target.engine_id), None)
        if worker is None or worker["state"] != "healthy":
            return
        if self._tokens_at_step_start is None:
            self._tokens_at_step_start = worker["tokens_generated"]
        made = worker["tokens_generated"] - self._tokens_at_step_start
        if worker["running"] == 0 or made < self.settings.after_tokens:
            return
        self.launch.preempt(target.engine_id)
        self.preempted.append(target.engine_id)
        self.timeline.event(
            "preempted",
            f"SIGKILL with {worker['running']} samples in flight",
            target.engine_id,
        )
        self.launch.check_processes()  # deregisters it (the manager may have noticed first)
        if self.settings.replace:
            joined = self.launch.add_engine(self.pool)
            self.timeline.event("joined", f"joined on v{joined.weight_version}", joined.engine_id)
