"""Multi-turn rollouts: a step's samples run as agent episodes on the manager's sessions.

An episode opens a session and sends the prompt; then the environment answers the model's last turn
with tokens of its own (a tool's output), sent as the next turn's input, until the environment ends
the episode or `max_turns` turns are done. The session keeps its engine (and that engine's prefix
cache) from turn to turn, and survives an engine that dies (see rollflow/runtime/manager/core/sessions.py).

The closed session's record becomes one sample in the shape of a batch sample, with `loss_mask` over
its output (0 on the environment's tokens), so the rest of the trainer (staleness, tensors, loss)
treats an episode as any sample and trains on the model's own tokens only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from rollflow.runtime.manager.client import ManagerClient, ManagerError, ManagerUnreachable

log = logging.getLogger(__name__)

MAX_PARALLEL_EPISODES = 32  # episodes in flight at once (each waits on one turn at a time)

Environment = Callable[[list[int], list[list[int]], Any], "list[int] | None"]


def episode_sample(record: dict, num_prompt: int) -> dict:
    """A closed session as a trainer sample: the prompt, then every turn and environment token as its
    output, the spans placed in that output."""
    turns = record["turns"]
    spans = [
        span | {"start": span["start"] - num_prompt, "end": span["end"] - num_prompt}
        for turn in turns
        for span in turn["spans"]
    ]
    return {
        "sample_id": record["session_id"],
        "prompt_ids": record["context_ids"][:num_prompt],
        "output_ids": record["context_ids"][num_prompt:],
        "output_logprobs": record["logprobs"][num_prompt:],
        "loss_mask": record["loss_mask"][num_prompt:],
        "spans": spans,
        "state": "finished",
        "finish_reason": turns[-1]["finish_reason"] if turns else None,
        "weight_version": record["weight_version"],
        "resumes": sum(turn["resumes"] for turn in turns),
        "num_turns": len(turns),
        "error": None,
    }


@dataclass(frozen=True)
class EpisodeRunner:
    """How each episode of a step runs: on `client`'s sessions, `environment` answering each turn, at
    most `max_turns` turns sampled with `sampling_params`."""

    client: ManagerClient
    environment: Environment
    tokenizer: Any
    max_turns: int
    sampling_params: dict[str, Any]
    allow_off_policy: bool = False

    def run(self, prompt: list[int], cancelled: threading.Event) -> dict:
        """One episode from `prompt`, as a trainer sample; once `cancelled`, it ends after its running turn."""
        try:
            session_id = self.client.open_session(allow_off_policy=self.allow_off_policy)
        except (ManagerError, ManagerUnreachable) as exc:
            return _failed(prompt, f"could not open a session: {exc}")
        turns: list[list[int]] = []
        try:
            input_ids: list[int] | None = prompt
            while input_ids is not None and len(turns) < self.max_turns and not cancelled.is_set():
                answer = self.client.send_turn(session_id, input_ids, **self.sampling_params)
                turns.append(answer["output_ids"])
                input_ids = self.environment(prompt, turns, self.tokenizer)
            record = self.client.close_session(session_id)
        except (ManagerError, ManagerUnreachable) as exc:
            return _failed(prompt, f"session {session_id} failed after {len(turns)} turns: {exc}")
        if not turns:
            return _failed(prompt, "cancelled before its first turn")
        return episode_sample(record, len(prompt))


class EpisodeBatch:
    """One step's episodes, `n` per prompt, run on threads; groups are handed out as they finish,
    like a manager batch's (`BatchHandle.micro_batches`)."""

    def __init__(self, runner: EpisodeRunner, prompts: list[list[int]], n: int) -> None:
        self._cancelled = threading.Event()
        self._pool = ThreadPoolExecutor(min(MAX_PARALLEL_EPISODES, len(prompts) * n), "episode")
        self._groups: list[list[Future]] = [
            [self._pool.submit(runner.run, list(prompt), self._cancelled) for _ in range(n)]
            for prompt in prompts
        ]

    def micro_batches(
        self, min_groups: int = 1, max_groups: int | None = None, timeout_s: float | None = None
    ) -> Iterator[list[list[dict]]]:
        """Finished groups in completion order, `min_groups` to `max_groups` at a time (fewer at the end)."""
        remaining, ready = list(self._groups), []
        while remaining or ready:
            finished = [group for group in remaining if all(f.done() for f in group)]
            remaining = [group for group in remaining if group not in finished]
            ready += finished
            if ready and (len(ready) >= min_groups or not remaining):
                take, ready = ready[: max_groups or len(ready)], ready[max_groups or len(ready) :]
                yield [[future.result() for future in group] for group in take]
                continue
            wait([f for group in remaining for f in group if not f.done()], timeout_s, FIRST_COMPLETED)
        self._pool.shutdown()

    def cancel(self) -> None:
        """Stop: episodes end after their running turn and close their sessions."""
        self._cancelled.set()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _failed(prompt: list[int], error: str) -> dict:
    log.warning("episode failed: %s", error)
    return {
        "prompt_ids": prompt,
        "output_ids": [],
        "spans": [],
        "state": "failed",
        "error": error,
        "resumes": 0,
    }
