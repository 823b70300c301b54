"""Tiny Llama-shaped state dicts, and a weight server running in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from rollflow.runtime.launch.process import rollflow_command
from rollflow.runtime.launch.servers import run_rollflow
from rollflow.runtime.weights import WeightPuller, WeightServer, WeightStore, WeightTransferError
from tests.factories import REPO


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """A two-layer Llama-shaped state dict (about 60 KB) with a tied head, norms and a buffer."""
    gen = torch.Generator().manual_seed(seed)
    hidden, inter, vocab = 32, 64, 100
    state = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen).to(dtype)}
    for layer in range(2):
        prefix = f"model.layers.{layer}."
        for name, shape in [
            ("self_attn.q_proj.weight", (hidden, hidden)),
            ("self_attn.k_proj.weight", (hidden // 2, hidden)),
            ("self_attn.v_proj.weight", (hidden // 2, hidden)),
            ("self_attn.o_proj.weight", (hidden, hidden)),
            ("mlp.gate_proj.weight", (inter, hidden)),
            ("mlp.up_proj.weight", (inter, hidden)),
            ("mlp.down_proj.weight", (hidden, inter)),
        ]:
            state[prefix + name] = (torch.randn(*shape, generator=gen) * 0.02).to(dtype)
        state[prefix + "input_layernorm.weight"] = torch.ones(hidden, dtype=dtype)
    state["model.norm.weight"] = torch.ones(hidden, dtype=dtype)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied, as small Llamas are
    state["model.rotary_emb.inv_freq"] = torch.rand(hidden // 2, generator=gen)
    state["step"] = torch.tensor(seed, dtype=torch.int64)
    return state


def train_step(state: dict[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """A copy in which about `fraction` of each bf16 matrix's weights move by one ulp, the way
    small optimizer updates leave most bf16 weights unchanged."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        tensor = tensor.clone()
        if tensor.dim() == 2 and name != "lm_head.weight":
            bits = tensor.view(torch.int16)
            moved = torch.rand(bits.shape, generator=gen) < fraction
            bits[moved] += 1
        out[name] = tensor
    return out


def assert_same_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        # bit for bit: torch.equal would call NaN != NaN and -0.0 == 0.0
        assert torch.equal(_bits(got[name]), _bits(want[name])), name


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


@contextlib.asynccontextmanager
async def serving(store: WeightStore, **kwargs) -> AsyncIterator[WeightServer]:
    server = WeightServer(store, **kwargs)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def rollflow(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return run_rollflow(*args, env=os.environ, cwd=cwd)


def start_server_process(
    store_dir: Path, *extra: str, env: dict | None = None
) -> tuple[subprocess.Popen, str]:
    """`rollflow weights serve` on a free port; returns the process and its URL once it listens."""
    log = store_dir.parent / f"serve-{time.monotonic_ns()}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            rollflow_command(
                "weights",
                "serve",
                "--dir",
                str(store_dir),
                "--port",
                "0",
                *extra,
            ),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log.read_text()
        if " on http://" in text:  # (other lines, Mooncake's, may hold " on " too)
            return proc, "http://" + text.split(" on http://")[1].split()[0]
        if proc.poll() is not None:
            raise RuntimeError(f"weight server exited: {text}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("weight server did not start within 60 s")


def pull_through_a_killed_server(store_dir: Path, cache: Path, *serve_args: str, transport: str = "http"):
    """The one scenario of a server killed mid-pull, over either transport: a one-chunk-at-a-time
    pull whose server process is killed after its 4th chunk must raise (no half-loaded weights), and
    a pull from the restarted server must resume. Returns (chunks done when killed, that result)."""
    process, url = start_server_process(store_dir, *serve_args)
    killed_after: list[int] = []

    def kill_after_four(done: int, total: int) -> None:
        if done == 4:
            process.kill()
            process.wait()
            killed_after.append(done)

    async def pull_one_chunk_at_a_time(url: str, on_chunk=None):
        async with WeightPuller(
            url,
            cache,
            transport=transport,
            max_attempts=2,
            retry_delay_s=0.1,
            parallel_chunks=1,
            on_chunk=on_chunk,
        ) as puller:
            return await puller.pull()

    try:
        with pytest.raises(WeightTransferError, match="failed after 2 attempts"):
            asyncio.run(pull_one_chunk_at_a_time(url, kill_after_four))
        process, url = start_server_process(store_dir, *serve_args)  # the engine retries against it
        return killed_after, asyncio.run(pull_one_chunk_at_a_time(url))
    finally:
        process.kill()
        process.wait()
