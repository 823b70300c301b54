"""Rank 1..N-1 of a tensor-parallel built-in engine: started by rank 0, runs what it broadcasts.

    python -m rollflow.runtime.engines.builtin.tp_rank --model DIR --tensor-parallel N --rank R --port P

The rank loads the model folder, keeps its slices (`slices.py`) and loops: a Forward runs the
model on its KV cache of that sequence; a Pull fetches its own slices of a version from the weight
server in a background thread (decoding goes on meanwhile); a Stage receives its slices of an
upload from rank 0; a Commit reports whether the staged slices are ready and copies them in when
every rank's are. The rank exits on Stop, or when rank 0 is gone (its next collective fails).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rollflow.runtime.engines.builtin.tensor_parallel import (
    Commit,
    Forward,
    Pull,
    Stage,
    init_group,
    rank_device,
    shard_model,
)
from rollflow.runtime.engines.builtin.weights import WeightChecker
from rollflow.runtime.weights.checkpoint import read_saved_weights
from rollflow.runtime.weights.puller import LoadedWeights, PullResult, WeightPuller
from rollflow.runtime.weights.slices import shard_state
from rollflow.runtime.worker_pipe import Stop

logger = logging.getLogger(__name__)


class RankWorker:
    """One rank's model, KV caches and staged slices; every method runs on the main thread."""

    def __init__(
        self,
        model: Any,
        tp_size: int,
        rank: int,
        control: Any,
        pull_cache: Path,
        pulled: LoadedWeights | None,
    ) -> None:
        """`pulled`: the whole version the model folder holds as published (its first delta base), if any."""
        self.model = model
        self.tp_size = tp_size
        self.rank = rank
        self.control = control
        self.pull_cache = pull_cache
        self.checker = WeightChecker(model)
        self.caches: dict[int, Any] = {}
        # this rank's slices of the version it pulled last, exactly as published (the delta base)
        self.pulled = (
            None
            if pulled is None
            else LoadedWeights(pulled.version, shard_state(pulled.state_dict, tp_size, rank))
        )
        # a version being staged: checked tensors, the LoadedWeights that becomes the delta base
        # and the bytes its pull read (None for a Stage), and why staging failed; filled by a
        # Pull's thread or a Stage
        self._staged: tuple[dict[str, torch.Tensor], LoadedWeights | None, int | None] | None = None
        self._stage_error: str | None = None
        self._pulling: threading.Thread | None = None

    def run(self) -> None:
        with torch.inference_mode():
            while True:
                box: list[Any] = [None]
                dist.broadcast_object_list(box, src=0, group=self.control)
                command = box[0]
                if isinstance(command, Stop):
                    return
                if isinstance(command, Forward):
                    self.forward(command)
                elif isinstance(command, Pull):
                    self.start_pull(command)
                elif isinstance(command, Stage):
                    self.stage(command)
                elif isinstance(command, Commit):
                    self.commit()

    def forward(self, command: Forward) -> None:
        for cache_id in command.freed:
            self.caches.pop(cache_id, None)
        input_ids = torch.tensor([command.input_ids], dtype=torch.long, device=self.model.device)
        cache = self.caches.get(command.cache_id)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        self.caches[command.cache_id] = out.past_key_values

    def start_pull(self, command: Pull) -> None:
        if self._pulling is not None:  # a pull rank 0 never committed: it must not stage over this one
            self._pulling.join()
        self._staged, self._stage_error = None, None
        self._pulling = threading.Thread(
            target=self._pull, args=(command,), name="rollflow-tp-pull", daemon=True
        )
        self._pulling.start()

    def _pull(self, command: Pull) -> None:
        async def pull() -> PullResult:
            async with WeightPuller(command.url, self.pull_cache, transport=command.transport) as puller:
                return await puller.pull(
                    command.weight_version, command.codec, base=self.pulled, tp=(self.tp_size, self.rank)
                )

        try:
            result = asyncio.run(pull())
            weights = result.weights
            self._staged = (
                self.checker.check(weights.state_dict, full=True),
                weights,
                result.stats.wire_nbytes,
            )
        except Exception as exc:
            self._stage_error = f"{type(exc).__name__}: {exc}"

    def stage(self, command: Stage) -> None:
        received: list[Any] = [None]
        dist.scatter_object_list(received, None, src=0, group=self.control)
        self._staged, self._stage_error = None, None
        try:
            self._staged = (self.checker.check(received[0], command.full), None, None)
        except Exception as exc:
            self._stage_error = f"{type(exc).__name__}: {exc}"

    def commit(self) -> None:
        if self._pulling is not None:
            self._pulling.join()
            self._pulling = None
        error = self._stage_error or (None if self._staged is not None else "nothing staged")
        wire_nbytes = self._staged[2] if self._staged is not None else None
        verdicts: list[Any] = [None] * self.tp_size
        dist.all_gather_object(verdicts, (error, wire_nbytes), group=self.control)
        staged, self._staged = self._staged, None
        if any(why is not None for why, _ in verdicts) or staged is None:
            return
        tensors, pulled, _ = staged
        params = self.model.state_dict()
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
        self.pulled = pulled
        self.caches.clear()  # keys and values of the old weights (rank 0 drops its caches too)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tensor-parallel", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    logging.basicConfig(level="WARNING", format=f"%(asctime)s %(levelname)s tp-rank-{args.rank}: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    device = rank_device(args.device, args.rank)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype))
    model = model.to(device).eval()
    shard_model(model, args.tensor_parallel, args.rank)
    control = init_group(args.rank, args.tensor_parallel, args.port, device)
    with tempfile.TemporaryDirectory(prefix=f"rollflow-tp{args.rank}-pull-") as pull_cache:
        try:
            pulled = read_saved_weights(args.model)
            RankWorker(model, args.tensor_parallel, args.rank, control, Path(pull_cache), pulled).run()
        except RuntimeError as exc:  # rank 0 is gone: a collective failed
            logger.warning("leaving: %s", exc)
            raise SystemExit(1) from None
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
