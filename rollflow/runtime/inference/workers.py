"""Inference workers: each micro-batch's reference (and PPO's old-policy) log-probs, between manager and actor.

RLinf's pipeline is rollout -> inference -> actor: finished groups go to inference, which adds the
frozen reference model's per-token log-probs, then to the actor, which then needs no reference model of
its own. Here one worker process per inference device (a CPU slot with its own thread budget, or a GPU)
holds the reference model. `InferencePool.stream` reads the manager's micro-batches on a thread of its
own, ahead of the trainer, keeps every worker busy, and yields the annotated micro-batches in arrival
order (each sample gains `ref_logprobs`, one per output token). Once it has processed every sample of the
step the pool releases its devices: the workers drop their models (`pool.releases` records how long that
took) and load them again at the next step's first micro-batch.

Without an inference placement none of this runs: the trainer computes the reference log-probs itself.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from typing import TYPE_CHECKING, Any

import torch

from rollflow.runtime.launch.process import wait_or_kill
from rollflow.runtime.worker_pipe import Stop, accept_workers, connect_to_leader, receive, send

if TYPE_CHECKING:
    from rollflow.policy.placement import ClusterConfig
    from rollflow.runtime.trainer.config import TrainConfig
    from rollflow.runtime.trainer.loop import Trainer

log = logging.getLogger(__name__)

ENV_PREFIX = "ROLLFLOW_INFERENCE_"
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class OldPolicy:
    """PPO: the policy version the step's samples were generated with, and its weights folder."""

    folder: str
    version: int


@dataclass(frozen=True)
class Compute:
    """The reference (and, with `old_policy`, the old policy's) log-probs of a micro-batch's samples."""

    groups: list[list[dict]]
    pad_id: int
    old_policy: OldPolicy | None
    recompute: list[list[bool]]  # [group][sample]: the old policy made all of its tokens (PPO only)


@dataclass(frozen=True)
class Computed:
    ref_logprobs: list[list[list[float]]]  # [group][sample][output token]
    old_logprobs: list[list[list[float] | None]] | None  # the same from the old policy; None: not recomputed


@dataclass(frozen=True)
class Release:
    """Drop the models and free their memory; the next Compute loads them again."""


@dataclass(frozen=True)
class Released:
    seconds: float


@dataclass
class _Worker:
    process: subprocess.Popen
    connection: Connection | None = None


@dataclass
class InferencePool:
    """The trainer's handle on the inference workers."""

    config: TrainConfig
    workers: list[_Worker]
    listener: Listener
    samples_done: int = 0  # samples of the current step whose log-probs the workers computed so far
    step_done: bool = False  # every sample of the current step is processed (and the devices released)
    releases: list[float] = field(default_factory=list)  # seconds of each release, one per step

    @classmethod
    def start(cls, config: TrainConfig, devices: tuple[str, ...], threads: int) -> InferencePool:
        authkey = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        env = {
            **os.environ,
            f"{ENV_PREFIX}CONTROL_PORT": str(listener.address[1]),
            f"{ENV_PREFIX}AUTHKEY": authkey.hex(),
            f"{ENV_PREFIX}THREADS": str(threads),
            f"{ENV_PREFIX}CONFIG": config.model_dump_json(),
        }
        workers = []
        for index, device in enumerate(devices):
            worker_env = {**env, f"{ENV_PREFIX}INDEX": str(index), f"{ENV_PREFIX}DEVICE": device}
            argv = [sys.executable, "-m", "rollflow.runtime.inference.workers"]
            workers.append(_Worker(subprocess.Popen(argv, env=worker_env)))
        pool = cls(config, workers, listener)
        try:
            pool._connect()
        except BaseException:
            pool.close()
            raise
        log.info("inference: %d worker(s) started (%s)", len(workers), ", ".join(devices))
        return pool

    def stream(
        self, micro_batches: Iterator[list[list[dict]]], pad_id: int, old_policy: OldPolicy | None = None
    ) -> Iterator[list[list[dict]]]:
        """The step's micro-batches, each sample with its `ref_logprobs`, in the order they arrived.

        With `old_policy` (PPO) a sample whose every token that version made also gets `old_logprobs`,
        recomputed by the trainer's own model code (RLinf's recomputed "prev" log-probs), which the
        importance ratio then uses instead of the engine's recorded ones."""
        self.samples_done, self.step_done = 0, False
        tasks: queue.Queue = queue.Queue(maxsize=len(self.workers))
        results: dict[int, Any] = {}
        ready = threading.Condition()
        threads = [
            threading.Thread(target=self._read, args=(micro_batches, tasks, results, ready), daemon=True)
        ]
        threads += [
            threading.Thread(
                target=self._serve, args=(worker, tasks, results, ready, pad_id, old_policy), daemon=True
            )
            for worker in self.workers
        ]
        for thread in threads:
            thread.start()
        # release as soon as every sample is processed, while the actor may still be training on them
        finisher = threading.Thread(target=self._release_after, args=(threads,), daemon=True)
        finisher.start()
        index = 0
        while True:
            with ready:
                ready.wait_for(lambda index=index: index in results)
                result = results.pop(index)
            if isinstance(result, BaseException):
                raise result
            if result is None:  # the manager has no more micro-batches for this step
                break
            yield result
            index += 1
        finisher.join()

    def close(self) -> None:
        for worker in self.workers:
            if worker.connection is not None and worker.process.poll() is None:
                with contextlib.suppress(OSError):
                    send(worker.connection, Stop())
        for worker in self.workers:
            wait_or_kill(worker.process, 30)
        self.listener.close()

    def _read(
        self, micro_batches: Iterator, tasks: queue.Queue, results: dict, ready: threading.Condition
    ) -> None:
        """The feeder: the manager's micro-batches, numbered, into the workers' queue."""
        count = 0
        try:
            for groups in micro_batches:
                tasks.put((count, groups))
                count += 1
        except Exception as exc:  # re-raised by the consumer, in order
            with ready:
                results[count] = exc
                ready.notify_all()
            count += 1
        else:
            with ready:
                results[count] = None
                ready.notify_all()
        for _ in self.workers:
            tasks.put(None)

    def _serve(
        self,
        worker: _Worker,
        tasks: queue.Queue,
        results: dict,
        ready: threading.Condition,
        pad_id: int,
        old_policy: OldPolicy | None,
    ) -> None:
        """One worker's thread: send it the next micro-batch, put back the annotated groups."""
        assert worker.connection is not None
        while (task := tasks.get()) is not None:
            index, groups = task
            recompute = [[_made_by(sample, old_policy) for sample in group] for group in groups]
            try:
                send(worker.connection, Compute(groups, pad_id, old_policy, recompute))
                answer: Computed = receive(worker.connection)
                annotated = _annotate(groups, answer)
            except (EOFError, OSError) as exc:
                annotated = RuntimeError(
                    f"inference worker died (exit status {worker.process.poll()}): {exc}"
                )
            with ready:
                if not isinstance(annotated, BaseException):
                    self.samples_done += sum(len(group) for group in groups)
                results[index] = annotated
                ready.notify_all()

    def _release_after(self, threads: list[threading.Thread]) -> None:
        """Every sample of the step is processed (the feeder and every worker's thread are done): the
        workers free their devices."""
        for thread in threads:
            thread.join()
        started = time.monotonic()
        try:
            for worker in self.workers:
                assert worker.connection is not None
                send(worker.connection, Release())
            for worker in self.workers:
                assert worker.connection is not None
                receive(worker.connection)
        except (EOFError, OSError) as exc:
            log.warning("inference: a worker is gone, its device was not released: %s", exc)
            return
        seconds = time.monotonic() - started
        self.releases.append(seconds)
        self.step_done = True
        log.info("inference: %d samples processed; devices released in %.3f s", self.samples_done, seconds)

    def _connect(self) -> None:
        processes = {index: worker.process for index, worker in enumerate(self.workers)}
        who = ("inference", "worker")
        for index, connection in accept_workers(self.listener, processes, START_TIMEOUT_S, who).items():
            self.workers[index].connection = connection


def _made_by(sample: dict, old_policy: OldPolicy | None) -> bool:
    """Every token of the sample came from the old policy's version (so recomputing its log-probs is right)."""
    if old_policy is None:
        return False
    versions = {span["weight_version"] for span in sample.get("spans", [])}
    return versions == {old_policy.version}


def _annotate(groups: list[list[dict]], answer: Computed) -> list[list[dict]]:
    annotated = []
    for g, group in enumerate(groups):
        samples = []
        for i, sample in enumerate(group):
            extra: dict[str, Any] = {"ref_logprobs": answer.ref_logprobs[g][i]}
            if answer.old_logprobs is not None and answer.old_logprobs[g][i] is not None:
                extra["old_logprobs"] = answer.old_logprobs[g][i]
            samples.append({**sample, **extra})
        annotated.append(samples)
    return annotated


def start_inference(trainer: Trainer, cluster: ClusterConfig) -> InferencePool:
    """One worker per device of the placement's inference range; sets `trainer.inference`."""
    span = cluster.ranges()["inference"]
    devices = tuple("cpu" if cluster.device == "cpu" else f"cuda:{i}" for i in span.devices())
    pool = InferencePool.start(trainer.config, devices, cluster.threads_per_device)
    trainer.inference = pool
    return pool


class _Models:
    """A worker's reference model (and PPO's old policy), loaded on first use and dropped on release."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.model: torch.nn.Module | None = None
        self.old_policy: torch.nn.Module | None = None
        self.old_version: int | None = None

    def logprobs(self, message: Compute) -> Computed:
        from rollflow.runtime.trainer.models import load_reference
        from rollflow.runtime.trainer.rollouts import to_tensors

        if self.model is None:
            self.model = load_reference(self.config.model).to(self.config.device)
        rollout = to_tensors(message.groups, message.pad_id).to(self.config.device)
        ref = self._per_sample(self.model, rollout, message.groups)
        old = None
        wanted = message.old_policy
        if wanted is not None and any(any(flags) for flags in message.recompute):
            if self.old_version != wanted.version or self.old_policy is None:
                self.old_policy = load_reference(wanted.folder).to(self.config.device)
                self.old_version = wanted.version
            rows = self._per_sample(self.old_policy, rollout, message.groups)
            old = [
                [row if flag else None for row, flag in zip(group_rows, flags, strict=True)]
                for group_rows, flags in zip(rows, message.recompute, strict=True)
            ]
        return Computed(ref, old)

    def _per_sample(
        self, model: torch.nn.Module, rollout: Any, groups: list[list[dict]]
    ) -> list[list[list[float]]]:
        """Each sample's log-probs of its output tokens under `model`."""
        from rollflow.runtime.trainer.models import token_logprobs

        with torch.no_grad():
            rows = token_logprobs(
                model, rollout.input_ids, rollout.attention_mask, self.config.temperature
            ).cpu()
        out, row = [], 0
        for group in groups:
            per_group = []
            for sample in group:
                start = len(sample["prompt_ids"]) - 1
                per_group.append(rows[row, start : start + len(sample["output_ids"])].tolist())
                row += 1
            out.append(per_group)
        return out

    def release(self) -> Released:
        started = time.monotonic()
        self.model = self.old_policy = None
        self.old_version = None
        gc.collect()
        if torch.device(self.config.device).type == "cuda":
            torch.cuda.empty_cache()
        return Released(time.monotonic() - started)


def main() -> None:
    """One inference worker, started by `InferencePool.start`."""
    from rollflow.runtime.logs import setup_logging
    from rollflow.runtime.trainer.config import TrainConfig

    setup_logging("text")
    env = {key[len(ENV_PREFIX) :]: value for key, value in os.environ.items() if key.startswith(ENV_PREFIX)}
    torch.set_num_threads(int(env["THREADS"]))
    raw = json.loads(env["CONFIG"])
    config = TrainConfig.model_validate({**raw, "device": env["DEVICE"], "cluster": None})
    models = _Models(config)
    connection = connect_to_leader(int(env["CONTROL_PORT"]), bytes.fromhex(env["AUTHKEY"]), int(env["INDEX"]))
    while True:
        try:
            message = receive(connection)
        except EOFError:
            return
        if isinstance(message, Stop):
            return
        if isinstance(message, Compute):
            send(connection, models.logprobs(message))
        elif isinstance(message, Release):
            send(connection, models.release())
        else:
            raise RuntimeError(f"inference worker: unexpected message {message!r}")


if __name__ == "__main__":
    # the module's own main, not this __main__ copy: messages are pickled as the module's classes
    from rollflow.runtime.inference.workers import main as worker_main

    worker_main()
