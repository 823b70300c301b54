"""Partial rollout (`partial_rollout: N`): over-sample, train on the first groups to finish, carry the rest.

A step runs `prompts_per_step + N` groups: the groups carried from the last step first (each unfinished
sample resumed from its tokens, on the engines' new weights), then fresh prompts to make up the count.
Once `prompts_per_step` groups have finished, the step's rollout ends: every sample still running is
aborted on its engine with the tokens it has (the manager's `/abort_request` keeps partial output) and
its group is carried into the next step, as is a surplus group that finished whole. So the long tail of
a step is not waited for; its tokens are finished next step instead (slime's `--partial-rollout`).

Every token keeps the weight version that made it (the manager's spans; a resumed sample's new spans
are appended after its old ones), so the importance ratio and the staleness bound see each token's own
version. A carried sample whose oldest token would be more than `max_staleness` versions behind the
policy that trains it is regenerated from its prompt (its tokens dropped, counted in
`tokens_regenerated`), never dropped: a group is always trained whole.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rollflow.runtime.manager.client import BatchHandle, ManagerClient, ManagerError, ManagerUnreachable
from rollflow.runtime.trainer.rollouts import oldest_version

MAX_PARALLEL_RESUMES = 256  # carried samples resumed at once (each a blocking /generate on a thread)
ABORT_AGAIN_S = 5.0  # at a rollout's end, resumes still running after this long are aborted again


def is_unfinished(sample: dict) -> bool:
    """An aborted sample (the end of its step's rollout cut it off) that still has tokens to make."""
    return sample["state"] == "finished" and sample["finish_reason"] == "abort"


def carried_tokens(groups: list[list[dict]]) -> int:
    return sum(len(sample["output_ids"]) for group in groups for sample in group)


@dataclass
class CarryBook:
    """What partial rollout carries between steps, and its run totals (the run summary's)."""

    groups: list[list[dict]] = field(default_factory=list)  # carried into the next step
    samples_carried: int = 0  # over the run: samples carried out of a step
    tokens_carried: int = 0  # over the run: their tokens at the time
    tokens_regenerated: int = 0  # carried tokens dropped by the staleness bound (sample restarted)

    def carry(self, groups: list[list[dict]]) -> None:
        for group in groups:
            for sample in group:
                sample["carried"] = sample.get("carried", 0) + 1
        self.groups = groups
        self.samples_carried += sum(len(group) for group in groups)
        self.tokens_carried += carried_tokens(groups)

    def take(self, train_version: int, max_staleness: int) -> list[list[dict]]:
        """The carried groups, for a step trained by version `train_version`; a sample whose oldest
        token would be too stale by then starts over from its prompt."""
        groups, self.groups = self.groups, []
        for sample in (sample for group in groups for sample in group):
            oldest = oldest_version(sample)
            if oldest is not None and train_version - oldest > max_staleness:
                self.tokens_regenerated += len(sample["output_ids"])
                sample |= {"output_ids": [], "output_logprobs": [], "spans": []}
                sample |= {"state": "finished", "finish_reason": "abort"}
        return groups


class PartialStep:
    """One step's rollout under partial rollout; iterated like `BatchHandle.micro_batches`.

    `on_end(leftover groups)` is called once the step's `quota` groups have been handed out and every
    other sample has been aborted and collected: those are what the step carries.
    """

    def __init__(
        self,
        client: ManagerClient,
        carried: list[list[dict]],
        submit_fresh: Callable[[], BatchHandle],
        n: int,
        sampling_params: dict[str, Any],
        quota: int,
        on_end: Callable[[list[list[dict]]], None],
        extra_groups: int = 0,
    ) -> None:
        self.client = client
        self.extra_groups = extra_groups  # groups beside the quota this step runs (its metrics report it)
        self.n = n
        self.sampling_params = sampling_params
        self.quota = quota
        self.on_end = on_end
        self._ready: queue.Queue[list[dict] | BaseException] = queue.Queue()
        self._ending = threading.Event()
        self._aborted = threading.Event()  # the rollout's end was told to the manager: nothing runs on
        self._num_arrived = 0  # finished groups the producers handed on
        self._running_rids: set[str] = set()
        self._lock = threading.Lock()
        self._received_fresh: list[int] = []  # group indexes of the fresh batch taken from the manager
        self._pool = ThreadPoolExecutor(MAX_PARALLEL_RESUMES, "resume")
        # the carried samples' resumes go to the manager before the fresh prompts, so they run first
        # (as many as run at once: the rest follow as those end)
        to_resume = sum(is_unfinished(sample) for group in carried for sample in group)
        self._unsent = min(to_resume, MAX_PARALLEL_RESUMES)
        self._resumes_left = to_resume  # carried samples whose resume has not returned (or been skipped)
        self._all_sent = threading.Event()
        # carried groups alone can fill the quota, and end the rollout, before the fresh batch exists:
        # its end then waits for the batch, to abort it too (every fresh group is carried, unstarted)
        self._fresh_submitted = threading.Event()
        if not self._unsent:
            self._all_sent.set()
        self._running = 0  # producers (one per carried group, one for the fresh batch) not yet ended
        for group in carried:
            self._start(self._finish_group, group)
        self._all_sent.wait()
        try:
            self.fresh = submit_fresh()
        finally:
            self._fresh_submitted.set()  # or failed: this constructor raises, and no one waits on the step
        self.num_samples = (len(carried) + self.fresh.num_groups) * n
        self._start(self._feed_fresh)

    @property
    def batch_id(self) -> str:
        """The manager's batch of the step's fresh prompts (the carried samples are resumed apart)."""
        return self.fresh.batch_id

    def states(self) -> dict[str, int]:
        """The step's samples by state, as the manager counts a batch's (`GET /batches/{id}`): what a
        live executor (rollflow/runtime/dynamic/) follows. Once the quota is reached and the manager has
        aborted what ran then (each ends at once with its tokens, wherever it was: the trainer collects
        it to carry), the step's rollout is done: every sample counts as finished."""
        if self._aborted.is_set():
            return {"waiting": 0, "running": 0, "finished": self.num_samples, "failed": 0}
        try:
            fresh = self.client.request("GET", f"/batches/{self.fresh.batch_id}")["states"]
        except ManagerError as exc:
            if exc.status != 404:
                raise
            fresh = {"waiting": 0, "running": 0}  # delivered whole: the manager forgot it
        with self._lock:
            running = len(self._running_rids)
            waiting = self._resumes_left - running
        waiting += fresh["waiting"]
        running += fresh["running"]
        return {
            "waiting": waiting,
            "running": running,
            "finished": self.num_samples - waiting - running,
            "failed": 0,
        }

    def _sent(self) -> None:
        """One carried sample's resume is on its way (or needs none)."""
        with self._lock:
            self._unsent -= 1
            if self._unsent <= 0:
                self._all_sent.set()

    def _start(self, target: Callable, *args: Any) -> None:
        self._running += 1
        threading.Thread(target=self._produce, args=(target, *args), daemon=True).start()

    def _produce(self, target: Callable, *args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # handed to the trainer's thread, which raises it
            self._ready.put(exc)
        finally:
            self._ready.put(_DONE)

    def _finish_group(self, group: list[dict]) -> None:
        """Resume the group's unfinished samples (all at once) and hand the group on, whole."""
        resumes = [self._pool.submit(self._resume, sample) for sample in group if is_unfinished(sample)]
        for resume in resumes:
            resume.result()
        self._arrive(group)

    def _resume(self, sample: dict) -> None:
        """Continue one sample from its tokens: its prompt and output so far are the input, and it asks
        for the tokens it lacks. The answer's tokens, log-probs and spans are appended to its own."""
        remaining = self.sampling_params["max_new_tokens"] - len(sample["output_ids"])
        rid = f"resume-{sample['sample_id']}-{uuid.uuid4().hex[:8]}"
        with self._lock:  # the rollout's end aborts it, or it is not sent: never neither
            sending = remaining > 0 and not self._ending.is_set()
            if sending:
                self._running_rids.add(rid)
            else:
                self._resumes_left -= 1
        if not sending:
            self._sent()
            return
        body = {
            "input_ids": sample["prompt_ids"] + sample["output_ids"],
            "sampling_params": self.sampling_params | {"max_new_tokens": remaining},
            "return_logprob": True,
            "rid": rid,
            "allow_off_policy": True,  # its tokens span versions already
        }
        self._sent()
        try:
            answer = self.client.request("POST", "/generate", body)
        except (ManagerError, ManagerUnreachable) as exc:
            sample |= {"state": "failed", "error": f"resuming a carried sample failed: {exc}"}
            return
        finally:
            with self._lock:
                self._running_rids.discard(rid)
                self._resumes_left -= 1
        append_continuation(sample, answer)

    def _feed_fresh(self) -> None:
        for groups in self.fresh.micro_batches(min_groups=1):
            for group in groups:
                self._received_fresh.append(group[0]["group_index"])
                self._arrive(group)

    def _arrive(self, group: list[dict]) -> None:
        """A finished group, on its producer's thread: the quota's last one ends the rollout at once,
        whether or not the trainer is still busy with an earlier micro-batch."""
        with self._lock:
            self._num_arrived += 1
            last = self._num_arrived == self.quota
        self._ready.put(group)
        if last:
            self._abort_running()

    def micro_batches(self, min_groups: int = 1, max_groups: int | None = None) -> Iterator[list[list[dict]]]:
        """The first `quota` groups to finish, `max_groups` at a time. The rollout ends as the last of
        them arrives (`_arrive`): what still runs is aborted, and carried once collected, before the
        trainer takes that last micro-batch."""
        size = max_groups or min_groups
        handed, taken = 0, []
        while handed + len(taken) < self.quota and self._running:
            item = self._next()
            if item is None:
                continue
            taken.append(item)
            if len(taken) == size and handed + len(taken) < self.quota:
                handed += len(taken)
                yield taken
                taken = []
        self._end_rollout()
        if taken:
            yield taken

    def _next(self, timeout_s: float | None = None) -> list[dict] | None:
        """The next finished group; None when a producer ended instead (queue.Empty after `timeout_s`)."""
        item = self._ready.get(timeout=timeout_s)
        if item is _DONE:
            self._running -= 1
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def _abort_running(self) -> None:
        """Abort whatever still runs; each sample keeps its tokens. Once: by the quota's last group, or
        by `_end_rollout` when the producers ended short of the quota."""
        with self._lock:
            if self._ending.is_set():
                return
            self._ending.set()
            rids = list(self._running_rids)
        self._fresh_submitted.wait()
        taken = set(self._received_fresh)  # a group taken meanwhile is finished: its abort is a no-op
        self.fresh.abort_groups([g for g in range(self.fresh.num_groups) if g not in taken], self.n)
        for rid in rids:
            self.client.request("POST", "/abort_request", {"rid": rid})
        self._aborted.set()

    def _end_rollout(self) -> None:
        """Collect every group not handed out (the rollout aborted first, if it is not yet), and pass
        them to `on_end`."""
        self._abort_running()
        leftover = []
        while self._running:
            try:
                item = self._next(timeout_s=ABORT_AGAIN_S)
            except queue.Empty:
                # a resume whose /generate reached the manager after its abort: abort it again
                with self._lock:
                    rids = list(self._running_rids)
                for rid in rids:
                    self.client.request("POST", "/abort_request", {"rid": rid})
                continue
            if item is not None:
                leftover.append(item)
        self._pool.shutdown()
        self.on_end(leftover)

    def cancel(self) -> None:
        """Stop: the fresh batch is cancelled, resumes are aborted; nothing is carried."""
        self._ending.set()
        self.fresh.cancel()
        with self._lock:
            rids = list(self._running_rids)
        for rid in rids:
            self.client.request("POST", "/abort_request", {"rid": rid})
        self._pool.shutdown(wait=False, cancel_futures=True)


_DONE = object()  # a producer thread ended


def append_continuation(sample: dict, answer: dict) -> None:
    """Append a `/generate` continuation of `sample` to it: tokens, log-probs, spans (moved past the
    tokens it had), finish reason. (`resumes` stays the manager's count of its own resumes: a carry is
    counted as such, in `carried`.)"""
    offset = len(sample["output_ids"])
    meta = answer["meta_info"]
    sample["output_ids"] = sample["output_ids"] + answer["output_ids"]
    sample["output_logprobs"] = sample["output_logprobs"] + [
        entry[0] for entry in meta["output_token_logprobs"]
    ]
    sample["spans"] = sample["spans"] + [
        span | {"start": span["start"] + offset, "end": span["end"] + offset} for span in meta["spans"]
    ]
    reason = meta["finish_reason"] or {"type": "abort"}
    sample["finish_reason"] = reason["type"]
    sample["resumes"] += meta["resumes"]
