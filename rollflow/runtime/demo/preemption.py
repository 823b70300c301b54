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
        self._tokens_at_step_start = 0  # step 1's engine starts with none; later steps note theirs
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.wait(TICK_S):
                self.launch.check_processes()
                if self.preempted:
                    continue
                step = self.step_in_progress()
                if step == self.settings.step - 1:
                    self._note_tokens_before_the_step()
                elif step == self.settings.step:
                    self._maybe_preempt()
        except BaseException as exc:  # the main thread re-raises it after the trainer stops
            self.error = exc

    def stop(self) -> None:
        """Stop the thread; raises what it failed with, if anything."""
        self._stop_event.set()
        self.join()
        if self.error is not None:
            raise self.error

    def _watched_engine(self) -> tuple[int, dict] | None:
        """The pool's first engine and its row in the manager's worker list, while it is healthy."""
        target = next((e for e in self.launch.engines.values() if e.pool is self.pool), None)
        if target is None:
            return None
        worker = next((w for w in self.launch.manager.workers() if w["id"] == target.engine_id), None)
        if worker is None or worker["state"] != "healthy":
            return None
        return target.engine_id, worker

    def _note_tokens_before_the_step(self) -> None:
        """Counts the step's tokens from the end of the step before, so that a first look that comes
        late (this thread shares the GIL with the trainer) does not move the start of the count."""
        found = self._watched_engine()
        if found is not None:
            self._tokens_at_step_start = found[1]["tokens_generated"]

    def _maybe_preempt(self) -> None:
        found = self._watched_engine()
        if found is None:
            return
        engine_id, worker = found
        made = worker["tokens_generated"] - self._tokens_at_step_start
        if worker["running"] == 0 or made < self.settings.after_tokens:
            return
        self.launch.preempt(engine_id)
        self.preempted.append(engine_id)
        self.timeline.event("preempted", f"SIGKILL with {worker['running']} samples in flight", engine_id)
        self.launch.check_processes()  # deregisters it (the manager may have noticed first)
        if self.settings.replace:
            joined = self.launch.add_engine(self.pool)
            self.timeline.event("joined", f"joined on v{joined.weight_version}", joined.engine_id)
