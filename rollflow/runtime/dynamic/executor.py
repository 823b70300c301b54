"""The live executor of the resource policy's plans: RLinf's auto scheduler on real processes.

At each trigger (step start, a group done, rollout done, inference done, an actor mini-batch end)
it reads the live state (the manager's unfinished samples per engine and its batch's progress, the
trainer's mini-batches done, inference's progress), builds the `ResourceSnapshot`, asks the same
policy object `rollflow rl-sim` uses, and applies the plan:

    snapshot -> policy.decide -> release engines (drain + free memory, via the manager)
                              -> release inference -> actor target size (grown between mini-batches)

A move that fails (an engine that will not sleep or dies while releasing, an actor that cannot
grow) is logged and the step goes on with what it had. At step end the actor returns to its base
size and released engines wake and rejoin, before the trainer pushes the new weights to every engine.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from rollflow.policy.resources import ResourcePlan, ResourceScheduler, ResourceSnapshot, Trigger
from rollflow.runtime.dynamic.moves import DeviceLedger, Move, MoveKind, StepRecord
from rollflow.runtime.dynamic.snapshot import (
    EngineSlot,
    LiveLayout,
    LiveProgress,
    build_snapshot,
    spread_queue,
)
from rollflow.runtime.manager.client import ManagerClient, ManagerError, ManagerUnreachable

log = logging.getLogger(__name__)


class ElasticActor(Protocol):
    """What the executor needs of the actor: its size, and growing or shrinking between mini-batches."""

    @property
    def num_devices(self) -> int: ...

    def resize(self, num_devices: int) -> None:
        """Train the next mini-batches on `num_devices` devices; raises if a joining rank fails."""
        ...


class FixedActor:
    """An actor that cannot change size (one trainer process): grow moves are logged as failed."""

    def __init__(self, num_devices: int) -> None:
        self.num_devices = num_devices

    def resize(self, num_devices: int) -> None:
        raise RuntimeError("this actor is one process and cannot change its size")


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """The step the executor follows."""

    step: int
    batch_id: str
    num_samples: int
    minibatch_samples: int
    num_minibatches: int
    # the step's samples by state ({waiting, running, finished, failed}); None: the manager's batch
    # `batch_id` holds them all (partial rollout resumes carried samples beside its batch)
    states: Callable[[], dict[str, int]] | None = None


class DynamicExecutor:
    def __init__(
        self,
        policy: ResourceScheduler,
        manager: ManagerClient,
        layout: LiveLayout,
        actor: ElasticActor,
        inference_done: Callable[[], bool] | None = None,
        release_inference: Callable[[], float | None] | None = None,
        poll_interval_s: float = 0.05,
    ) -> None:
        """`layout`: where things sit at every step start. `inference_done`/`release_inference`: the
        live inference component (None: none placed; the actor computes log-probs itself);
        `release_inference` may return the seconds the release took, when inference released itself.
        Woken engines rejoin on the weights they held; the trainer's push at step end (after
        `end_step`) brings them to the new version with the others."""
        self.policy = policy
        self.manager = manager
        self.base = layout
        self.actor = actor
        self._inference_done = inference_done
        self._release_inference = release_inference
        self._poll_interval_s = poll_interval_s
        self._lock = threading.RLock()
        self.clock0 = time.perf_counter()  # time 0 of moves, holdings and step records
        self.ledger = DeviceLedger(_owners(layout))
        self.steps: list[StepRecord] = []
        self.decisions: list[tuple[ResourceSnapshot, ResourcePlan]] = []
        self._step: StepInputs | None = None
        self._watch: threading.Thread | None = None
        self._stop_watch = threading.Event()

    # ------------------------------------------------------------------ step lifecycle

    def begin_step(self, inputs: StepInputs) -> None:
        """A step's batch was submitted: follow it until `end_step`."""
        with self._lock:
            self._step = inputs
            self._record = StepRecord(inputs.step, started_s=self._t())
            self.steps.append(self._record)
            self.layout = self.base
            self._released: list[EngineSlot] = []
            self._failed: set[int] = set()
            self._minibatches_done = 0
            self._finished_at_minibatch = 0
            self._target = self.base.actor_devices
            self._rollout_done = self._inference_seen = False
            self._step_started = time.perf_counter()
            borrowed = [d for e in self.base.engines if e.borrowed for d in _slot_devices(e)]
            self.ledger.assign(borrowed, "rollout", self._t())
            self.decide("step_start")
        self._stop_watch.clear()
        self._watch = threading.Thread(target=self._watch_rollout, name="rollflow-executor", daemon=True)
        self._watch.start()

    def before_minibatch(self, index: int) -> int:
        """Called by the actor before mini-batch `index`: waits where the plan holds the last one
        (wait_before_last_iter), grows the actor to the plan's size, and returns the size it trains on."""
        step = self._require_step()
        last = index == step.num_minibatches - 1
        hold = self.decisions and self.decisions[-1][1].hold_last_minibatch
        if last and hold:
            waited = time.perf_counter()
            while not (self._rollout_done and self._inference_finished()):
                time.sleep(self._poll_interval_s)
            waited_s = time.perf_counter() - waited
            with self._lock:
                self.decide("rollout_done" if not self._inference_seen else "inference_done")
                self._grow(
                    "wait_before_last_iter", f"after waiting {waited_s:.2f}s for rollout and inference"
                )
        else:
            with self._lock:
                self._grow("grow_actor")
        size = self.actor.num_devices
        self._record.actor_sizes.append(size)
        return size

    def minibatch_end(self) -> None:
        """The actor finished a mini-batch (its optimizer step): rollout may release engines now."""
        with self._lock:
            self._minibatches_done += 1
            self.decide("minibatch_end")
            self._finished_at_minibatch = self._num_finished

    def end_step(self) -> StepRecord:
        """Stop following the step: the actor shrinks back and released engines wake and rejoin (call it
        before the weights are pushed, so the push reaches them)."""
        self._stop_watch.set()
        if self._watch is not None:
            self._watch.join()
        with self._lock:
            now = time.perf_counter()
            if self.actor.num_devices != self.base.actor_devices:
                self._timed(
                    "shrink_actor",
                    "step_end",
                    range(self.base.actor_devices, self.actor.num_devices),
                    lambda: self.actor.resize(self.base.actor_devices),
                    f"actor {self.actor.num_devices} -> {self.base.actor_devices} devices",
                    started=now,
                )
            for slot in self._released:
                self._resume(slot)
            self.ledger.assign(_devices(self.base, "rollout"), "rollout", self._t())
            if self.base.inference_range is not None:
                self.ledger.assign(_devices(self.base, "inference"), "inference", self._t())
            self._step = None
            self._record.ended_s = self._t()
            return self._record

    # ------------------------------------------------------------------ deciding

    def decide(self, trigger: Trigger) -> ResourcePlan:
        """Snapshot the live state, ask the policy, apply the plan."""
        with self._lock:
            snapshot = build_snapshot(trigger, self.layout, self._progress())
            plan = self.policy.decide(snapshot)
            self.decisions.append((snapshot, plan))
            self._apply(plan, snapshot)
            return plan

    def _progress(self) -> LiveProgress:
        step = self._require_step()
        states = step.states() if step.states is not None else self._batch_states(step)
        running = {e.engine_id: 0 for e in self.layout.engines}
        for worker in self.manager.workers():
            if worker["id"] in running:
                running[worker["id"]] = worker["running"]
        self._num_finished = states["finished"] + states["failed"]
        unfinished = step.num_samples - self._num_finished
        if unfinished == 0 and not self._rollout_done:
            self._rollout_done = True
            self._record.rollout_done_s = self._t()
        return LiveProgress(
            now=time.perf_counter() - self._step_started,
            engine_unfinished=spread_queue(running, states["waiting"]),
            num_samples=step.num_samples,
            num_unfinished=unfinished,
            finished_since_minibatch=self._num_finished - self._finished_at_minibatch,
            minibatch_samples=step.minibatch_samples,
            num_minibatches=step.num_minibatches,
            minibatches_done=self._minibatches_done,
            inference_done=self._inference_finished(),
        )

    def _batch_states(self, step: StepInputs) -> dict[str, int]:
        try:
            return self.manager.request("GET", f"/batches/{step.batch_id}")["states"]
        except ManagerError as exc:
            if exc.status != 404:
                raise
            # the manager forgets a batch once its last micro-batch is delivered: all of it is done
            return {"waiting": 0, "running": 0, "finished": step.num_samples, "failed": 0}

    def _inference_finished(self) -> bool:
        if self._inference_done is None:
            return self._rollout_done  # the actor computes log-probs itself, as samples arrive
        return self._inference_done()

    def _apply(self, plan: ResourcePlan, snapshot: ResourceSnapshot) -> None:
        by_id = {e.engine_id: e for e in self.layout.engines}
        for engine_id in plan.release_instances:
            slot = by_id.get(engine_id)
            if slot is not None and engine_id not in self._failed:
                self._release(slot, snapshot.trigger)
        if plan.release_inference and self.layout.inference_range is not None:
            start, count = self.layout.inference_range
            ok = self._timed(
                "release_inference",
                snapshot.trigger,
                range(start, start + count),
                self._release_inference or (lambda: None),
                "inference processed every sample",
            )
            if ok:
                self.layout = dataclasses.replace(self.layout, inference_range=None)
                self.ledger.assign(range(start, start + count), "idle", self._t())
        if plan.actor_gpus > self._target:
            self._target = plan.actor_gpus

    def _release(self, slot: EngineSlot, trigger: str) -> None:
        kind: MoveKind = "pre_process" if slot.borrowed else "release_engine"
        devices = _slot_devices(slot)
        answer: dict = {}

        def release() -> None:
            answer.update(self.manager.release_worker(slot.engine_id))

        ok = self._timed(kind, trigger, devices, release, f"engine {slot.engine_id}")
        if not ok:
            self._failed.add(slot.engine_id)
            return
        moved = answer.get("move", {}).get("samples_moved", 0)
        self._record.moves[-1] = dataclasses.replace(
            self._record.moves[-1], detail=f"engine {slot.engine_id}: {moved} samples moved"
        )
        self.layout = dataclasses.replace(
            self.layout, engines=tuple(e for e in self.layout.engines if e.engine_id != slot.engine_id)
        )
        self._released.append(slot)
        self._record.engines_released.append(slot.engine_id)
        self.ledger.assign(devices, "actor" if slot.borrowed else "idle", self._t())

    def _grow(self, kind: MoveKind, note: str = "") -> None:
        current = self.actor.num_devices
        if self._target <= current:
            return
        target = self._target
        ok = self._timed(
            kind,
            "minibatch_end" if kind == "grow_actor" else "rollout_done",
            range(current, target),
            lambda: self.actor.resize(target),
            f"actor {current} -> {target} devices" + (f" {note}" if note else ""),
        )
        if ok:
            self.layout = dataclasses.replace(self.layout, actor_devices=target)
            self.ledger.assign(range(current, target), "actor", self._t())
        else:
            self._target = current

    def _resume(self, slot: EngineSlot) -> None:
        self._timed(
            "resume_engine",
            "step_end",
            _slot_devices(slot),
            lambda: self.manager.resume_worker(slot.engine_id),
            f"engine {slot.engine_id}",
        )

    def _timed(
        self,
        kind: MoveKind,
        trigger: str,
        devices: range,
        action: Callable[[], object],
        detail: str,
        started: float | None = None,
    ) -> bool:
        """Run one move, log it with its seconds (those `action` returns, when it returns a number: a
        component that moved by itself says how long it took); a failure is logged, never raised."""
        started = time.perf_counter() if started is None else started
        took: object = None
        try:
            took = action()
        except (ManagerError, ManagerUnreachable, RuntimeError, OSError) as exc:
            ok, detail = False, f"{detail}: failed ({exc}); the step goes on with what it had"
            log.warning("step %d: %s %s", self._record.step, kind, detail)
        else:
            ok = True
        seconds = took if isinstance(took, float) else time.perf_counter() - started
        if ok:
            log.info("step %d: %s %s in %.3fs", self._record.step, kind, detail, seconds)
        self._record.moves.append(
            Move(
                self._record.step,
                kind,
                trigger,
                started - self.clock0,
                seconds,
                tuple(devices),
                ok,
                detail,
            )
        )
        return ok

    # ------------------------------------------------------------------ watching rollout

    def _watch_rollout(self) -> None:
        """Decide as groups finish (pre_process hands back under its threshold), once when rollout is
        done and once when inference is."""
        seen = -1
        while not self._stop_watch.wait(self._poll_interval_s):
            with self._lock:
                if self._step is None:
                    return
                was_done, inference_was = self._rollout_done, self._inference_seen
                progress = self._progress()
                if not was_done and self._rollout_done:
                    self.decide("rollout_done")
                elif progress.num_unfinished != seen and not self._rollout_done:
                    self.decide("group_done")
                seen = progress.num_unfinished
                if not inference_was and self.base.inference_range is not None and self._inference_finished():
                    self._inference_seen = True
                    self._record.inference_done_s = self._t()
                    self.decide("inference_done")
                if self._rollout_done and (self._inference_seen or self.base.inference_range is None):
                    return

    def _require_step(self) -> StepInputs:
        if self._step is None:
            raise RuntimeError("no step is being followed (begin_step first)")
        return self._step

    def _t(self) -> float:
        return time.perf_counter() - self.clock0


def _slot_devices(slot: EngineSlot) -> range:
    return range(slot.device_start, slot.device_start + slot.num_devices)


def _devices(layout: LiveLayout, component: str) -> list[int]:
    if component == "rollout":
        return [d for e in layout.engines if not e.borrowed for d in _slot_devices(e)]
    start, count = layout.inference_range
    return list(range(start, start + count))


def _owners(layout: LiveLayout) -> list:
    owners = ["idle"] * layout.num_devices
    for device in range(layout.actor_devices):
        owners[device] = "actor"
    for device in _devices(layout, "rollout"):
        owners[device] = "rollout"
    if layout.inference_range is not None:
        for device in _devices(layout, "inference"):
            owners[device] = "inference"
    return owners
