"""The simulator against the real vLLM server: a short trace replayed on both, the simulation on a
profile of that same server (`rollflow profile engine --kind vllm`, reduced grid).

The tolerance is the README's ("Against a real vLLM CPU server"): on the tiny model the tier
serves, whose 3-5 ms iterations are mostly overhead that other processes on the 2 shared cores
stretch or not from one second to the next, simulated medians came within a factor of 2 of real
ones (0.5-1.6 over the runs there). A ratio, never a wall-clock time: the assertion holds on a
fast machine and a slow one alike, and fails when the profile or the simulation is wrong by more
than the machine's noise (a per-layer or unit slip, a batch charged as serial requests, a lost
round trip).
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from rollflow.perf.profile.hf_config import load_model_config, model_shape_section
from rollflow.runtime.engines.profiler.trace_replay import (
    load_trace,
    printed_overrides,
    replay,
    simulate,
)
from tests.factories import CONV_TRACE
from tests.perf.profiling import run_rollflow

# vLLM's CPU defaults for its OpenAI server, which the tier's server runs with
MAX_NUM_SEQS, MAX_BATCHED_TOKENS = 128, 2048
NUM_REQUESTS, REPLAYS = 30, 4
LOAD = 0.3  # of the profiled batch-8 decode throughput, in requests/s
TOLERANCE = 2.0  # simulated / real median, either way


@pytest.mark.serial  # the server's profile and its replay must see the same machine, not 4 workers' load
def test_a_replay_on_real_vllm_and_its_simulation_on_the_servers_profile_agree(vllm_server, tmp_path):
    tables = tmp_path / "tables"
    proc = run_rollflow(
        "profile", "engine", "--url", vllm_server.url, "--kind", "vllm", "--model-config",
        str(vllm_server.model_dir), "--out", str(tables), "--batch-sizes", "1,2,4,8",
        "--prompt-lengths", "1,16,64,256", "--decode-prompt-lengths", "16,256", "--decode-tokens", "32",
        "--repeats", "5",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    overrides = printed_overrides(proc.stdout)
    assert sorted(overrides) == ["admission_ms", "idle_wakeup_ms", "request_overhead_ms"], proc.stdout
    round_trip_ms = overrides.pop("request_overhead_ms")
    batch_8 = next(line for line in lines if line.startswith("decode batch 8, KV "))
    iteration_s = float(batch_8.split()[5]) * 1e-3

    # the trace's first requests, time-scaled to a light load of this server as profiled
    base = load_trace(CONV_TRACE, NUM_REQUESTS, max_prompt=256, max_decode=64)
    rate = LOAD * 8 / iteration_s / float(np.mean([d for _, _, d in base]))
    scale = (len(base) - 1) / base[-1][0] / rate
    requests = [(arrival * scale, prompt, decode) for arrival, prompt, decode in base]

    salt = random.getrandbits(40)
    replays = [
        asyncio.run(replay("vllm", vllm_server.url, requests, salt=salt + r * NUM_REQUESTS))
        for r in range(REPLAYS)
    ]
    # the server's scheduler settings: chunked prefill at max_num_batched_tokens, batch cap at max_num_seqs
    sim = simulate(
        _rollflow,
        tmp_path,
        requests,
        tables,
        model_shape_section(load_model_config(vllm_server.model_dir)),
        round_trip_ms,
        MAX_NUM_SEQS,
        MAX_BATCHED_TOKENS,
        overrides,
    )
    for metric in ("tpot", "e2e"):
        # the least disturbed replay, as the profile keeps each mix's least disturbed round: other
        # processes on the machine only ever add time
        reals = [float(np.median([r[metric] for r in rows])) for rows in replays]
        simulated = float(np.median([float(r[metric]) for r in sim]))
        ratio = simulated / min(reals)
        summary = f"{metric} p50: real {reals} s, simulated {simulated:.4f} s, ratio {ratio:.2f}"
        print(summary)
        assert 1 / TOLERANCE <= ratio <= TOLERANCE, summary


def _rollflow(*args: str) -> None:
    """`rollflow ARGS`, failing the test with its stderr when it fails."""
    proc = run_rollflow(*args)
    assert proc.returncode == 0, proc.stderr
