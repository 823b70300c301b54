"""The elastic actor: one trainer process per device the actor may ever hold, each mini-batch on the active ones.

How the live executor uses it (rank 0 is the `Trainer` in the executor's process):

    from rollflow.runtime.inference.workers import start_inference
    from rollflow.runtime.trainer.config import TrainConfig
    from rollflow.runtime.trainer.elastic import start_elastic
    from rollflow.runtime.trainer.loop import Trainer

    config = TrainConfig(..., cluster={...})                # RLinf's section: rollflow.policy.placement.ClusterConfig
    cluster = config.cluster                                # .ranges() -> {"actor": DeviceRange(0, 1), ...}
    scheduler = cluster.scheduler()                         # the policy object rl-sim decides with, too
    trainer = Trainer(config, resume=False)                 # rank 0, the leader: talks to the manager
    actor = start_elastic(trainer, cluster)                 # a rank per device (auto_scheduler), actor's size active
    if "inference" in cluster.component_placement:          # else the trainer computes reference log-probs itself
        pool = start_inference(trainer, cluster)            # = trainer.inference
    trainer.minibatch_end_hooks.append(on_minibatch_end)    # called as hook(step, minibatches_done)
    trainer.run(on_step)                                    # closes the actor and the pool when the run ends

    def on_minibatch_end(step: int, minibatches_done: int) -> None:
        # between two mini-batches of `step` (after the optimizer step of the `minibatches_done`th;
        # also once after the step's last one, before the actor returns to its base size)
        plan = scheduler.decide(snapshot)                   # ResourceSnapshot(actor_gpus=actor.active_ranks,
                                                            #   minibatches_done=..., inference_done=pool.step_done)
        seconds = actor.resize(plan.actor_gpus)             # grow (or shrink): the next mini-batch trains on them
        ...                                                 # actor.moves[-1] is the Resize record of this call

- `actor.active_ranks`: ranks the next mini-batch trains on; `actor.base_ranks` the actor's placement
  size, which it returns to at every step end (`actor.end_step()`, called by the trainer).
- `actor.resize(n) -> seconds`: call it between mini-batches only (a `minibatch_end_hooks` hook, or
  before the step's first micro-batch); n is clamped to [1, actor.max_ranks]. A joining rank that dies
  or does not answer within `join_timeout_s` is dropped: the mini-batch trains on the ranks that made
  it, a warning says so, `actor.moves[-1].ok` is False, and `actor.max_ranks` drops below the dead rank.
- `actor.step_sizes`: the active size of each optimizer step (mini-batch) of the step so far;
  `actor.sizes_by_step[i]`: the same for step i + 1 once it ended (summary.json's `actor_sizes`).
- `actor.moves`: every `Resize` (step, mini-batches done, from, to, seconds, ok, reason).
- `pool.samples_done` (samples of the current step through inference), `pool.step_done` (all of them,
  and the workers have released their devices), `pool.releases` (seconds of each step's release).
- `trainer.config.minibatch_samples`, `trainer.config.minibatches_per_step`: ResourceSnapshot's
  minibatch_samples and num_minibatches (a step's groups fill micro-batches of `micro_batch_groups`).

The ranks are started once, in one gloo process group on 127.0.0.1 (each with the device slot's thread
budget, or its GPU), and stay up for the run: a mini-batch on k ranks splits each micro-batch's groups
over ranks 0..k-1 (`groups[r::k]`), each rank backpropagates its share scaled by its share of the
micro-batch's output tokens, and at the optimizer step the active ranks sum their gradients over the
process group of ranks 0..k-1 (made at start for every k), so each gradient equals the single-process one
and every active rank takes the same optimizer step. Idle ranks compute nothing and fall behind; a rank
that joins gets rank 0's parameters and optimizer state first. The control messages and that state go
over one connection per rank rather than a collective, so a joining rank that dies breaks only its own
connection: the others' collectives are untouched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, Listener
from typing import TYPE_CHECKING, Any

import torch
from torch import distributed as dist

from rollflow.runtime.launch.process import wait_or_kill
from rollflow.runtime.trainer.distributed import Share, output_tokens
from rollflow.runtime.worker_pipe import Stop, accept_workers, connect_to_leader, receive, send

if TYPE_CHECKING:
    from rollflow.policy.placement import ClusterConfig
    from rollflow.runtime.trainer.learner import Learner, MicroBatchRecord, StepTotals
    from rollflow.runtime.trainer.loop import Trainer

log = logging.getLogger(__name__)

ENV_PREFIX = "ROLLFLOW_ELASTIC_"  # how the leader tells a rank process where it sits
START_TIMEOUT_S = 300.0  # for every rank to load its models and connect


class RankLost(RuntimeError):
    """A rank died or did not answer in time."""


@dataclass(frozen=True)
class Join:
    """Rank 0's parameters and optimizer state for a joining rank."""

    parameters: list[torch.Tensor]  # the trainer's `parameters` (policy, then critic), on the CPU
    optimizer: dict[str, Any]  # optimizer.state_dict()


@dataclass(frozen=True)
class Joined:
    """A rank's answer once it holds rank 0's state."""

    rank: int


@dataclass(frozen=True)
class OptimizerStep:
    """Sum gradients over ranks 0..size-1, then take the optimizer step."""

    size: int


@dataclass(frozen=True)
class Resize:
    """One `resize` call: the executor's move log."""

    step: int  # the trainer's step during which it happened (steps done so far + 1)
    minibatches_done: int  # optimizer steps already taken in that step
    from_ranks: int
    to_ranks: int  # the size the actor has now (below the request when a join failed)
    requested: int
    seconds: float
    ok: bool  # False: a rank was lost while joining
    reason: str = ""  # what went wrong, when not ok


@dataclass(frozen=True)
class ElasticSpec:
    """Where the actor's ranks sit."""

    devices: tuple[str, ...]  # torch device of each rank, rank 0 first; one rank per device it may hold
    base_ranks: int  # the actor's placement size, to which it returns at every step end
    threads_per_rank: int  # torch threads of each rank (cpu device slots)
    join_timeout_s: float = 60.0  # how long a joining rank may take to load rank 0's state


def spec_from_cluster(
    cluster: ClusterConfig, may_grow: bool | None = None, join_timeout_s: float = 60.0
) -> ElasticSpec:
    """The actor starts on its placement's devices; it may grow over every device when `may_grow`
    (default: with auto_scheduler), so a rank is started on each of them."""
    if cluster.num_nodes != 1:
        from rollflow.errors import UserError

        raise UserError(
            f"config error: cluster.num_nodes: live runs use one machine (got {cluster.num_nodes})"
        )
    actor = cluster.ranges()["actor"]
    may_grow = cluster.auto_scheduler if may_grow is None else may_grow
    num_ranks = cluster.total_devices if may_grow else actor.count
    devices = tuple("cpu" if cluster.device == "cpu" else f"cuda:{i}" for i in range(num_ranks))
    return ElasticSpec(devices, actor.count, cluster.threads_per_device, join_timeout_s)


def start_elastic(trainer: Trainer, cluster: ClusterConfig | ElasticSpec) -> ElasticActor:
    """Start the actor's other ranks and make `trainer` their leader (sets `trainer.learner.actor`).

    `cluster`: usually `trainer.config.cluster`; an ElasticSpec places the ranks by hand."""
    spec = cluster if isinstance(cluster, ElasticSpec) else spec_from_cluster(cluster)
    actor = ElasticActor.start(trainer, spec)
    trainer.learner.actor = actor
    return actor


def micro_batch_shares(groups: list[list[dict]], scale: float, num_ranks: int) -> list[Share]:
    """Each active rank's groups (`groups[r::k]`, GRPO's groups stay whole) and loss scale: its share of
    the micro-batch's output tokens, so the gradients' sum is the single-process gradient."""
    total = max(output_tokens(groups), 1)
    shares = []
    for rank in range(num_ranks):
        mine = groups[rank::num_ranks]
        shares.append(Share(mine, scale * output_tokens(mine) / total))
    return shares


def sum_gradients(parameters: list[torch.nn.Parameter], group: Any) -> None:
    """Sum every parameter's gradient over `group` in one collective. A rank without a gradient adds
    zeros; a parameter no rank has a gradient for keeps none (the optimizer skips it, as in one process)."""
    present = torch.tensor([p.grad is not None for p in parameters], dtype=torch.float32)
    pieces = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float().cpu() for p in parameters
    ]
    flat = torch.cat([*pieces, present])
    dist.all_reduce(flat, group=group)
    offset = 0
    for index, param in enumerate(parameters):
        size = param.numel()
        if flat[-len(parameters) + index] > 0:
            param.grad = flat[offset : offset + size].view_as(param).to(param.device, param.dtype).clone()
        else:
            param.grad = None
        offset += size


def prefix_groups(world_size: int) -> dict[int, Any]:
    """The process group of ranks 0..k-1 for every k >= 2 (every rank makes them, in the same order)."""
    return {size: dist.new_group(list(range(size))) for size in range(2, world_size + 1)}


@dataclass
class _Rank:
    process: subprocess.Popen
    connection: Connection | None = None
    lost: bool = False


@dataclass
class ElasticActor:
    """Rank 0's handle on the actor: it trains its own share and drives the other ranks."""

    trainer: Trainer
    spec: ElasticSpec
    ranks: dict[int, _Rank]  # ranks 1.. by number
    groups: dict[int, Any]  # size -> process group of ranks 0..size-1
    listener: Listener
    active_ranks: int = 0  # ranks the next mini-batch trains on
    max_ranks: int = 0  # the largest size still possible (below the first lost rank)
    step_sizes: list[int] = field(default_factory=list)  # active size of each optimizer step of this step
    sizes_by_step: list[list[int]] = field(default_factory=list)  # step_sizes of every finished step
    moves: list[Resize] = field(default_factory=list)
    _accumulating: bool = False  # a mini-batch's gradients are being accumulated

    @property
    def base_ranks(self) -> int:
        return self.spec.base_ranks

    @classmethod
    def start(cls, trainer: Trainer, spec: ElasticSpec) -> ElasticActor:
        world = len(spec.devices)
        torch.set_num_threads(spec.threads_per_rank)
        authkey = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        timeout = timedelta(seconds=trainer.config.distributed_timeout_s)
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
        env = {
            **os.environ,
            f"{ENV_PREFIX}WORLD": str(world),
            f"{ENV_PREFIX}STORE_PORT": str(store.port),
            f"{ENV_PREFIX}CONTROL_PORT": str(listener.address[1]),
            f"{ENV_PREFIX}AUTHKEY": authkey.hex(),
            f"{ENV_PREFIX}THREADS": str(spec.threads_per_rank),
            f"{ENV_PREFIX}CONFIG": trainer.config.model_dump_json(),
        }
        ranks = {}
        for rank in range(1, world):
            rank_env = {**env, f"{ENV_PREFIX}RANK": str(rank), f"{ENV_PREFIX}DEVICE": spec.devices[rank]}
            argv = [sys.executable, "-m", "rollflow.runtime.trainer.elastic"]
            ranks[rank] = _Rank(subprocess.Popen(argv, env=rank_env))
        try:
            processes = {rank: member.process for rank, member in ranks.items()}
            for rank, connection in accept_workers(
                listener, processes, START_TIMEOUT_S, ("elastic actor", "rank")
            ).items():
                ranks[rank].connection = connection
            dist.init_process_group("gloo", store=store, rank=0, world_size=world, timeout=timeout)
            groups = prefix_groups(world)
        except BaseException:
            for member in ranks.values():
                member.process.kill()
                member.process.wait()
            listener.close()
            raise
        log.info(
            "elastic actor: %d ranks started (%s), %d active at each step start",
            world,
            ", ".join(spec.devices),
            spec.base_ranks,
        )
        actor = cls(trainer, spec, ranks, groups, listener, active_ranks=1, max_ranks=world)
        # the base ranks start from rank 0's state too (a resumed run restored it on rank 0 alone)
        problem = actor._grow(spec.base_ranks)
        if problem:
            actor.close()
            raise RuntimeError(f"elastic actor: rank(s) of its base size could not start: {problem}")
        return actor

    def resize(self, active_ranks: int) -> float:
        """Train the next mini-batch on `active_ranks` ranks; the seconds the move took."""
        if self._accumulating:
            raise RuntimeError(
                "resize the actor between mini-batches only (a mini-batch is half accumulated)"
            )
        started = time.monotonic()
        before = self.active_ranks
        target = max(1, min(active_ranks, self.max_ranks))
        if target == before:
            return 0.0
        reason = ""
        if target > before:
            reason = self._grow(target)
        else:
            self.active_ranks = target
        seconds = time.monotonic() - started
        self.moves.append(
            Resize(
                step=self.trainer.step + 1,
                minibatches_done=len(self.step_sizes),
                from_ranks=before,
                to_ranks=self.active_ranks,
                requested=active_ranks,
                seconds=seconds,
                ok=not reason,
                reason=reason,
            )
        )
        if self.active_ranks != before:
            log.info("actor: %d -> %d ranks in %.3f s", before, self.active_ranks, seconds)
        return seconds

    def train_micro_batch(self, groups: list[list[dict]], totals: StepTotals, scale: float) -> None:
        """Every active rank backpropagates its share; rank 0's runs here while the others run theirs."""
        self._accumulating = True
        shares = micro_batch_shares(groups, scale, self.active_ranks)
        busy = [rank for rank in range(1, self.active_ranks) if shares[rank].groups]
        for rank in busy:
            self._send(rank, shares[rank])
        totals.add(self.trainer.learner.backward(shares[0].groups, shares[0].loss_scale))
        for rank in busy:
            record: MicroBatchRecord = self._receive(rank, timeout=self.trainer.config.distributed_timeout_s)
            totals.add(record)

    def sum_gradients(self) -> None:
        """Before rank 0's optimizer step: the active ranks sum their gradients and step too."""
        self.step_sizes.append(self.active_ranks)
        self._accumulating = False
        if self.active_ranks == 1:
            return
        for rank in range(1, self.active_ranks):
            self._send(rank, OptimizerStep(self.active_ranks))
        sum_gradients(self.trainer.learner.parameters, self.groups[self.active_ranks])

    def end_step(self) -> list[int]:
        """Return to the base size; the step's per-mini-batch sizes (also kept in `sizes_by_step`)."""
        if self.active_ranks != self.base_ranks:
            self.resize(self.base_ranks)
        sizes, self.step_sizes = self.step_sizes, []
        self.sizes_by_step.append(sizes)
        return sizes

    def close(self) -> None:
        """Stop every rank and leave the process group."""
        for rank, member in self.ranks.items():
            if not member.lost:
                with contextlib.suppress(RankLost):
                    self._send(rank, Stop())
        for member in self.ranks.values():
            wait_or_kill(member.process, 30)
        self.listener.close()
        if dist.is_initialized():
            dist.destroy_process_group()

    def _grow(self, target: int) -> str:
        """Bring ranks active_ranks..target-1 in, one by one; what went wrong ('' when nothing)."""
        state = Join(
            [p.detach().cpu() for p in self.trainer.learner.parameters],
            _to_cpu(self.trainer.learner.optimizer.state_dict()),
        )
        before = self.active_ranks
        for rank in range(before, target):
            try:
                self._send_state(rank, state)
                answer = self._receive(rank, timeout=self.spec.join_timeout_s)
                if answer != Joined(rank):
                    raise RankLost(f"rank {rank} answered {answer!r} instead of joining")
            except RankLost as exc:
                self._lose(rank)
                log.warning(
                    "rank %d was lost while joining the actor (%d -> %d ranks): %s; the mini-batch trains on "
                    "the %d rank(s) it has, and the actor holds at most %d from now on",
                    rank,
                    before,
                    target,
                    exc,
                    self.active_ranks,
                    self.max_ranks,
                )
                return str(exc)
            self.active_ranks = rank + 1
        return ""

    def _send_state(self, rank: int, state: Join) -> None:
        self._send(rank, state)

    def _lose(self, rank: int) -> None:
        member = self.ranks[rank]
        member.lost = True
        self.max_ranks = min(self.max_ranks, rank)
        if member.process.poll() is None:  # alive but not answering: it can never rejoin, so end it
            member.process.kill()
        member.process.wait()

    def _send(self, rank: int, message: Any) -> None:
        member = self.ranks[rank]
        if member.lost or member.connection is None:
            raise RankLost(f"rank {rank} was lost earlier")
        try:
            send(member.connection, message)
        except OSError as exc:
            raise self._lost(rank, str(exc)) from None

    def _receive(self, rank: int, timeout: float) -> Any:
        connection = self.ranks[rank].connection
        assert connection is not None
        try:
            if not connection.poll(timeout):
                raise RankLost(f"rank {rank} did not answer within {timeout:g} s")
            return receive(connection)
        except (EOFError, OSError) as exc:
            raise self._lost(rank, str(exc) or "its connection closed") from None

    def _lost(self, rank: int, what: str) -> RankLost:
        process = self.ranks[rank].process
        try:
            code = process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return RankLost(f"rank {rank} is unreachable: {what}")
        return RankLost(f"rank {rank} died (exit status {code}): {what}")


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    return value


def _serve(learner: Learner, connection: Connection, rank: int, groups: dict[int, Any]) -> None:
    """A rank other than 0: carry out rank 0's messages until told to stop (or rank 0 is gone)."""
    while True:
        try:
            message = receive(connection)
        except EOFError:
            log.warning("rank %d: rank 0 is gone; stopping", rank)
            return
        if isinstance(message, Stop):
            return
        if isinstance(message, Share):
            send(connection, learner.backward(message.groups, message.loss_scale))
        elif isinstance(message, OptimizerStep):
            sum_gradients(learner.parameters, groups[message.size])
            learner.optimizer_step()
        elif isinstance(message, Join):
            with torch.no_grad():
                for param, value in zip(learner.parameters, message.parameters, strict=True):
                    param.copy_(value)
            learner.optimizer.load_state_dict(message.optimizer)
            learner.optimizer.zero_grad(set_to_none=True)
            send(connection, Joined(rank))
        else:
            raise RuntimeError(f"rank {rank}: unexpected message {message!r}")


def main() -> None:
    """A rank other than 0, started by `ElasticActor.start` with its place in the environment."""
    from transformers import AutoTokenizer

    from rollflow.runtime.logs import setup_logging
    from rollflow.runtime.trainer.config import TrainConfig
    from rollflow.runtime.trainer.learner import Learner

    setup_logging("text")
    env = {key[len(ENV_PREFIX) :]: value for key, value in os.environ.items() if key.startswith(ENV_PREFIX)}
    rank, world = int(env["RANK"]), int(env["WORLD"])
    torch.set_num_threads(int(env["THREADS"]))
    config = TrainConfig.model_validate({**json.loads(env["CONFIG"]), "device": env["DEVICE"]})
    if torch.device(config.device).type == "cuda":
        torch.cuda.set_device(torch.device(config.device))
    # only the models and optimizer: rank 0 alone talks to the manager and pushes weights
    learner = Learner(config, AutoTokenizer.from_pretrained(config.model), parallel=None, checkpoint=None)
    connection = connect_to_leader(int(env["CONTROL_PORT"]), bytes.fromhex(env["AUTHKEY"]), rank)
    timeout = timedelta(seconds=config.distributed_timeout_s)
    store = dist.TCPStore("127.0.0.1", int(env["STORE_PORT"]), world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        _serve(learner, connection, rank, prefix_groups(world))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    # run the module's own main, not this __main__ copy: messages are pickled as the module's classes
    from rollflow.runtime.trainer.elastic import main as rank_main

    rank_main()
