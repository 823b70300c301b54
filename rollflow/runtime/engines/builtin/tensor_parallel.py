"""Tensor parallelism for the built-in engine: N processes, each holding 1/N of every split layer.

Rank 0 is the engine process (HTTP and the generation thread); it starts ranks 1..N-1
(`tp_rank.py`) and drives them: before each model call its generation thread broadcasts the
command (the token ids, which KV cache they extend, the caches dropped since), and every rank then
runs the same forward, whose row-parallel layers sum their partial outputs with one all-reduce
each. The splits are `rollflow.runtime.weights.slices`: the embedding sums each rank's part of the
vocabulary (all-reduce) and lm_head gathers each rank's part of the logits (all-gather), so every
rank ends with the same logits and only rank 0 samples. Each rank keeps its
own KV caches (its own heads), named by an id rank 0 hands out.

A new weight version is a two-phase commit: every rank stages its own slices (pulled from the
weight server as a per-rank payload, or handed over by rank 0 for an upload), then rank 0 gathers
every rank's verdict and all of them copy in only when every rank staged its slices; a rank that
failed or died leaves every rank on the old version. A dead rank makes the engine unhealthy (503
on /health) for good: it is out of the pool until it is restarted.

All collectives run on rank 0's generation thread, in command order, so no two can interleave.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import subprocess
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from rollflow.errors import UserError
from rollflow.runtime.engines.builtin.worker import EngineFault
from rollflow.runtime.launch.process import wait_or_kill
from rollflow.runtime.weights.errors import WeightTransferError
from rollflow.runtime.weights.slices import ROW_PARALLEL, VOCAB_PARALLEL, check_divisible, shard_tensor
from rollflow.runtime.worker_pipe import Stop

logger = logging.getLogger(__name__)

EXIT_WAIT_S = 5.0
"""How long a failed collective waits for the rank that broke it to be reported exited."""
GROUP_TIMEOUT = timedelta(minutes=10)
"""How long a collective waits for a live but silent rank (a pull that long stalls decoding)."""


# ---- commands rank 0 broadcasts; ranks run them in order ------------------------------------------
@dataclass(frozen=True)
class Forward:
    """Run the model on `input_ids`, extending KV cache `cache_id` (a new one when unknown)."""

    cache_id: int
    input_ids: list[int]
    # caches rank 0 no longer holds: drop them first
    freed: tuple[int, ...]


@dataclass(frozen=True)
class Pull:
    """Start pulling this rank's slices of `weight_version` in the background (then a Commit)."""

    url: str
    weight_version: int
    codec: str
    transport: str


@dataclass(frozen=True)
class Stage:
    """Receive this rank's slices of an upload from rank 0 (scatter), checked as `full` or partial."""

    full: bool


@dataclass(frozen=True)
class Commit:
    """Report whether the staged slices are ready, and the bytes a pull of them read (all-gather);
    copy them in if every rank's are."""


Command = Forward | Pull | Stage | Commit | Stop


# ---- the model ---------------------------------------------------------------------------------------
def shard_model(model: Any, tp_size: int, rank: int) -> None:
    """Cut `model` (a transformers Llama-shaped causal LM) in place down to rank `rank`'s slices,
    and make its row-parallel layers sum their outputs, and its vocabulary-parallel ones join
    theirs, over the ranks."""
    config = model.config
    num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    why = check_divisible(
        config.num_attention_heads, num_kv_heads, config.intermediate_size, config.vocab_size, tp_size
    )
    if why is not None:
        raise UserError(why)
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is model.get_input_embeddings().weight
    num_row_parallel = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        for kind in ("weight", "bias"):
            param = getattr(module, kind)
            if param is not None:
                sliced = shard_tensor(f"{name}.{kind}", param.data, tp_size, rank)
                setattr(module, kind, torch.nn.Parameter(sliced.clone(), requires_grad=False))
        if name.endswith(ROW_PARALLEL):
            if module.bias is not None:
                raise UserError(f"tensor parallelism needs {name} without a bias (it would be added N times)")
            module.register_forward_hook(_sum_over_ranks)
            num_row_parallel += 1
        elif name.endswith(VOCAB_PARALLEL):
            module.register_forward_hook(_gather_vocabulary)
    embedding = model.get_input_embeddings()
    part = embedding.num_embeddings // tp_size
    sliced = VocabParallelEmbedding(part, embedding.embedding_dim, rank * part)
    sliced.weight = torch.nn.Parameter(
        shard_tensor("embed_tokens.weight", embedding.weight.data, tp_size, rank).clone(), requires_grad=False
    )
    model.set_input_embeddings(sliced.to(embedding.weight.device))
    if tied:  # the same rows of the same tensor: keep them one
        output.weight = sliced.weight
    if num_row_parallel == 0:
        raise UserError(
            f"tensor parallelism splits Llama-style layers ({', '.join(ROW_PARALLEL)}); "
            f"{type(model).__name__} has none"
        )


def _sum_over_ranks(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(output)
    return output


def _gather_vocabulary(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    """The logits of the whole vocabulary, from each rank's part of it, in rank order."""
    parts = [torch.empty_like(output) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, output.contiguous())
    return torch.cat(parts, dim=-1)


class VocabParallelEmbedding(torch.nn.Embedding):
    """Rows [start, start + num_embeddings) of the embedding: ids outside them embed to zeros here,
    and the sum over the ranks (all-reduce) gives every id the row of the rank that holds it."""

    def __init__(self, num_embeddings: int, embedding_dim: int, start: int) -> None:
        super().__init__(num_embeddings, embedding_dim, device="meta")
        self.start = start

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = torch.nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0)
        dist.all_reduce(out)
        return out


def rank_device(device: str, rank: int) -> str:
    """Rank `rank`'s device: the CPU for every rank, or the `rank`-th GPU from the one named."""
    torch_device = torch.device(device)
    if torch_device.type != "cuda":
        return device
    return f"cuda:{(torch_device.index or 0) + rank}"


def init_group(rank: int, tp_size: int, port: int, device: str) -> Any:
    """Join the ranks' process group (rank 0 hosts its store on `port`); returns the group that
    carries commands: gloo on the CPU always, the compute all-reduces on nccl where ranks hold GPUs."""
    on_gpu = torch.device(device).type == "cuda"
    if on_gpu:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(
        "nccl" if on_gpu else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=tp_size,
        timeout=GROUP_TIMEOUT,
    )
    return dist.new_group(backend="gloo", timeout=GROUP_TIMEOUT) if on_gpu else dist.group.WORLD


# ---- rank 0 -------------------------------------------------------------------------------------------
class RankGroup:
    """Rank 0's handle on ranks 1..N-1: starts them, sends them commands, knows when one died."""

    def __init__(self, tp_size: int, ranks: list[subprocess.Popen], control: Any) -> None:
        self.tp_size = tp_size
        self._ranks = ranks
        self._control = control
        # why the group cannot run anymore (a rank died, a collective failed); None while healthy
        self._broken: str | None = None

    @classmethod
    def start(cls, tp_size: int, rank_argv: list[str], port: int, device: str) -> RankGroup:
        """Start ranks 1..N-1 (`rank_argv` + `--rank R`) and join the group with them."""
        ranks = [
            subprocess.Popen([*rank_argv, "--rank", str(rank)], stdin=subprocess.DEVNULL)
            for rank in range(1, tp_size)
        ]
        try:
            control = init_group(0, tp_size, port, rank_device(device, 0))
        except BaseException:
            for proc in ranks:
                proc.kill()
            raise
        return cls(tp_size, ranks, control)

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._ranks]

    def fault(self) -> str | None:
        """Why this engine cannot serve (a rank exited, a collective failed), or None."""
        if self._broken is None:
            self._broken = self._exited_rank(wait_s=0.0)
        return self._broken

    def _exited_rank(self, wait_s: float) -> str | None:
        """Which rank has exited, waiting up to `wait_s` for one to (a peer whose sockets closed
        mid-collective is exiting, though its status may not be reported yet); None if none has."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, proc in enumerate(self._ranks, start=1):
                if proc.poll() is not None:
                    return f"tensor-parallel rank {rank} exited (code {proc.returncode})"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def send(self, command: Command) -> None:
        """Broadcast `command` to every rank (generation thread only)."""
        self._collective(lambda: dist.broadcast_object_list([command], src=0, group=self._control))

    def stage(self, shards: list[dict[str, torch.Tensor]], full: bool) -> None:
        """Hand ranks 1..N-1 their slices of an upload (`shards[r]`; rank 0's is its own)."""
        self.send(Stage(full))
        received: list[Any] = [None]
        payloads = [{}, *shards[1:]]
        self._collective(lambda: dist.scatter_object_list(received, payloads, src=0, group=self._control))

    def commit(self, rank0_error: str | None) -> list[int | None]:
        """Gather every rank's verdict on its staged slices; raise WeightTransferError (every rank
        keeps its old weights) unless all are ready, in which case ranks 1..N-1 copy theirs in.
        Returns the bytes each of ranks 1..N-1 read for a Pull (None for a Stage): what shows that
        each rank fetched only its slices."""
        self.send(Commit())
        verdicts: list[Any] = [None] * self.tp_size
        self._collective(lambda: dist.all_gather_object(verdicts, (rank0_error, None), group=self._control))
        failed = [f"rank {rank}: {why}" for rank, (why, _) in enumerate(verdicts) if why is not None]
        if failed:
            raise WeightTransferError("; ".join(failed))
        return [wire_nbytes for _, wire_nbytes in verdicts[1:]]

    def stop(self) -> None:
        if self.fault() is None:
            with contextlib.suppress(RuntimeError):  # a rank that died since: nothing to stop
                self.send(Stop())
        for proc in self._ranks:
            wait_or_kill(proc, 10)
        dist.destroy_process_group()

    def _collective(self, run: Any) -> None:
        why = self.fault()
        if why is not None:
            raise TensorParallelError(why)
        try:
            run()
        except RuntimeError as exc:  # gloo's answer to a peer that died mid-collective
            raise self.broken_by(exc) from None

    def broken_by(self, exc: RuntimeError) -> TensorParallelError:
        """Mark the group broken by a failed collective; the error names the rank that died, if one did."""
        if self._broken is None:
            self._broken = self._exited_rank(EXIT_WAIT_S) or f"a tensor-parallel collective failed: {exc}"
        return TensorParallelError(self._broken)


class TensorParallelError(EngineFault):
    """The ranks can no longer run together: the engine is out of service until restarted."""


class _CacheHandle:
    """Rank 0's KV cache of one sequence, and the id every rank knows its own part of it by."""

    def __init__(self, cache_id: int, freed: deque[int]) -> None:
        self.cache_id = cache_id
        self.kv: Any = None
        # when the worker drops the handle, the other ranks drop their parts with the next command
        weakref.finalize(self, freed.append, cache_id)


class TensorParallelModel:
    """Rank 0's shard of the model, called as the worker calls a model: each call runs on every rank."""

    def __init__(self, model: Any, group: RankGroup) -> None:
        self.model = model
        self.group = group
        self._cache_ids = itertools.count()
        # ids of dropped caches; a finalizer may append from any thread, so it is drained one by one
        self._freed: deque[int] = deque()

    @property
    def device(self) -> torch.device:
        return self.model.device

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def parameters(self):
        return self.model.parameters()

    def buffers(self):
        return self.model.buffers()

    def __call__(self, input_ids: torch.Tensor, past_key_values: Any, use_cache: bool = True) -> Any:
        handle = past_key_values or _CacheHandle(next(self._cache_ids), self._freed)
        freed = tuple(self._freed.popleft() for _ in range(len(self._freed)))
        self.group.send(Forward(handle.cache_id, input_ids[0].tolist(), freed))
        try:
            out = self.model(input_ids=input_ids, past_key_values=handle.kv, use_cache=True)
        except RuntimeError as exc:  # a collective inside the forward failed
            raise self.group.broken_by(exc) from None
        handle.kv = out.past_key_values
        return SimpleNamespace(logits=out.logits, past_key_values=handle)


def rank_argv(
    model_dir: str, tp_size: int, port: int, device: str, dtype: str, num_threads: int | None
) -> list[str]:
    """The command line of ranks 1..N-1, less `--rank R`."""
    argv = [sys.executable, "-m", "rollflow.runtime.engines.builtin.tp_rank", "--model", model_dir]
    argv += ["--tensor-parallel", str(tp_size), "--port", str(port), "--device", device, "--dtype", dtype]
    return argv + (["--threads", str(num_threads)] if num_threads else [])
