"""Load a model folder and serve it: what `rollflow engine serve` runs."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rollflow.errors import UserError
from rollflow.runtime.engines.builtin import DEFAULT_MAX_RUNNING_REQUESTS, DEFAULT_PREFIX_CACHE_TOKENS
from rollflow.runtime.http.limits import DEFAULT_LIMITS, BodyLimits
from rollflow.runtime.http.listen import bind
from rollflow.runtime.signals import run_until_sigterm

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def serve_engine(
    model_dir: str,
    host: str = "127.0.0.1",
    port: int = 30000,
    weight_version: int = 0,
    seed: int | None = None,
    num_threads: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    incremental_streaming_output: bool = False,
    api_key: str | None = None,
    max_body_bytes: int = 64 << 20,
    body_limits: BodyLimits = DEFAULT_LIMITS,
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
    tensor_parallel: int = 1,
) -> None:
    """Serve until interrupted; prints `serving on http://HOST:PORT` once requests are accepted.
    With `api_key`, every route but /health needs `Authorization: Bearer <api_key>`. The model
    runs on `device` (cpu, cuda, cuda:N) in `dtype`; sampling runs on the CPU in float32 whatever
    the device, so the same seed draws the same tokens from the same logits everywhere.

    `seed` seeds the samplers of requests that bring no `sampling_seed`; None draws one per engine,
    so engines started alike still sample differently (a GRPO group spread over engines must not
    hold the same sample twice).

    With `tensor_parallel` N > 1 this process is rank 0 of N (tensor_parallel.py): it starts ranks
    1..N-1 (on the GPUs after `device`'s, or all on the CPU) and serves without a prefix cache and
    without releasing memory."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not (Path(model_dir) / "config.json").is_file():
        raise UserError(
            f"--model {model_dir}: no config.json there (make one with `rollflow engine init-model`)"
        )
    sock = bind(host, port)  # before the model loads: a taken port is said at once
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from rollflow.runtime.engines.builtin.server import EngineServer, ServedModel, decode_text
    from rollflow.runtime.engines.builtin.weight_routes import EngineWeights
    from rollflow.runtime.engines.builtin.weights import WeightChecker
    from rollflow.runtime.engines.builtin.worker import GenerationWorker
    from rollflow.runtime.weights.checkpoint import read_saved_weights

    transformers_logging.disable_progress_bar()
    if num_threads:
        torch.set_num_threads(num_threads)
    torch_device = _torch_device(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def load_model():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        return model.to(torch_device).eval()

    model = load_model()
    config = model.config
    eos = model.generation_config.eos_token_id
    checker = WeightChecker(model)  # of the whole model: what uploads hold
    rank_checker, tp = checker, None
    if tensor_parallel > 1:
        model, tp = _start_ranks(model, model_dir, tensor_parallel, device, dtype, num_threads)
        rank_checker = WeightChecker(model.model)  # rank 0's slices: what its pulls hold
        load_model, prefix_cache_tokens = None, 0
    if eos is None:
        eos = config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    served = ServedModel(
        path=str(Path(model_dir).resolve()),
        tokenizer=tokenizer,
        vocab_size=config.vocab_size,
        max_context_length=config.max_position_embeddings,
    )
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
    logger.info("sampler seed %d", seed)
    worker = GenerationWorker(
        model,
        eos_ids,
        weight_version=weight_version,
        seed=seed,
        decode=lambda ids, params: decode_text(tokenizer, ids, params),
        max_running_requests=max_running_requests,
        prefix_cache_tokens=prefix_cache_tokens,
        reload_model=load_model,
    )
    del model  # the worker holds the only reference, so releasing its memory frees it
    # A folder written by a pull holds its version exactly as published: the base of the first delta.
    pulled = read_saved_weights(model_dir)
    if pulled is not None and pulled.version != weight_version:
        pulled = None
    if pulled is not None and tp is not None:
        from rollflow.runtime.weights.puller import LoadedWeights
        from rollflow.runtime.weights.slices import shard_state

        pulled = LoadedWeights(pulled.version, shard_state(pulled.state_dict, tp.tp_size, 0))
    with tempfile.TemporaryDirectory(prefix="rollflow-engine-pull-") as pull_cache:
        weights = EngineWeights(worker, checker, pull_cache, pulled, max_body_bytes, tp, rank_checker)
        server = EngineServer(
            served, worker, weights, incremental_streaming_output, api_key, max_body_bytes, tp
        )
        del pulled  # the server holds it, and drops it when the engine releases its memory
        worker.start()
        try:
            run_until_sigterm(lambda: _serve(server, sock, body_limits))
        finally:
            worker.stop()
            if tp is not None:
                tp.stop()


def _start_ranks(model, model_dir: str, tp_size: int, device: str, dtype: str, num_threads: int | None):
    """Cut `model` to rank 0's slices and start ranks 1..N-1; (rank 0's model, the group)."""
    from rollflow.runtime.engines.builtin.tensor_parallel import (
        RankGroup,
        TensorParallelModel,
        rank_argv,
        shard_model,
    )
    from rollflow.runtime.launch.process import free_port

    shard_model(model, tp_size, 0)
    port = free_port()
    group = RankGroup.start(
        tp_size, rank_argv(model_dir, tp_size, port, device, dtype, num_threads), port, device
    )
    logger.info("tensor parallel over %d ranks (pids %s)", tp_size, group.pids)
    return TensorParallelModel(model, group), group


def _torch_device(device: str) -> torch.device:
    """`device` as a torch device that this machine has; UserError naming the problem otherwise."""
    import torch

    try:
        torch_device = torch.device(device)
    except RuntimeError:
        raise UserError(f"--device: not a torch device: {device!r} (try cpu or cuda)") from None
    if torch_device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {device}: torch {torch.__version__} sees no CUDA GPU here")
        if (torch_device.index or 0) >= torch.cuda.device_count():
            raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif torch_device.type != "cpu":
        raise UserError(f"--device {device}: the built-in engine runs on cpu or cuda")
    return torch_device


async def _serve(server, sock: socket.socket, body_limits: BodyLimits) -> None:
    from aiohttp import web

    from rollflow.runtime.http.serve import GuardedRunner

    runner = GuardedRunner(server.build_app(), body_limits, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    bound_host, bound_port = runner.addresses[0][:2]
    print(f"serving on http://{bound_host}:{bound_port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
