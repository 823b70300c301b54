"""Stage 3: the rollout manager in front of the two engines, against the same requests sent to the
engines directly (the client alternating between them): tokens/s each way, and the CPU the manager
spends per token while the engines produce tokens at the device's rate.

The paths take turns slice by slice, so a drift in the machine's speed reaches both alike. Every
request streams `manager_tokens` tokens (past end-of-sequence) with their logprobs, as an RL client
reads them; a request that ends with fewer is an error."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path

import aiohttp
import orjson

from benchmarks.gpu.common import Budget, Fleet, Settings
from benchmarks.results import Results
from rollflow.runtime.deadline import within

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Judged on a GPU only: the manager passes on at least this share of what the engines give directly,
# and spends at most this share of one core doing it.
MIN_THROUGHPUT_RATIO = 0.9
MAX_MANAGER_CORES = 0.5


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def one(session: aiohttp.ClientSession, url: str, prompt: list[int], tokens: int) -> int:
    """Tokens the streamed answer carried; 0 when it was not a whole answer of `tokens` tokens."""
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True},
        "stream": True,
        "return_logprob": True,
    }
    async with session.post(url + "/generate", data=orjson.dumps(body)) as response:
        raw = await response.read()
    try:  # the last event before [DONE] holds the count (SGLang's completion_tokens)
        meta = orjson.loads(raw.rstrip().rsplit(b"data: ", 2)[-2])["meta_info"]
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
        return 0
    done = response.status == 200 and meta.get("finish_reason") is not None
    return meta["completion_tokens"] if done and meta["completion_tokens"] == tokens else 0


async def load(urls: list[str], settings: Settings, salt: int) -> tuple[int, int, float]:
    """(tokens, failed requests, seconds) of `manager_requests` requests at `manager_concurrency`,
    sent round robin over `urls`."""
    left = list(range(settings.manager_requests))
    cycle = itertools.cycle(urls)
    tokens, failed = 0, 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal tokens, failed
        while left:
            i = left.pop()
            got = await one(
                session, next(cycle), [3 + (salt + i + j) % 400 for j in range(16)], settings.manager_tokens
            )
            tokens += got
            failed += got == 0

    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(settings.manager_concurrency)))
    return tokens, failed, time.perf_counter() - started


async def measure(fleet: Fleet, settings: Settings, budget: Budget) -> dict[str, dict[str, float]]:
    paths = {"direct": [e.url for e in fleet.engines], "manager": [fleet.manager.url]}
    totals = {name: {"tokens": 0, "failed": 0, "s": 0.0, "cpu_s": 0.0} for name in paths}
    salts = itertools.count(0, 10**4)
    for urls in paths.values():  # warm-up: connections, CUDA kernels, caches
        await load(urls, settings, next(salts))
    for turn in range(settings.manager_slices):
        names = list(paths)[turn % 2 :] + list(paths)[: turn % 2]
        for name in names:
            budget.left()
            before = cpu_seconds(fleet.manager.proc.pid)
            tokens, failed, seconds = await load(paths[name], settings, next(salts))
            total = totals[name]
            total["tokens"] += tokens
            total["failed"] += failed
            total["s"] += seconds
            total["cpu_s"] += cpu_seconds(fleet.manager.proc.pid) - before
    return totals


def run(settings: Settings, fleet: Fleet, budget: Budget, results: Results) -> None:
    fleet.alive()
    totals = asyncio.run(within(measure(fleet, settings, budget), budget.left()))
    direct, managed = totals["direct"], totals["manager"]
    direct_rate, managed_rate = direct["tokens"] / direct["s"], managed["tokens"] / managed["s"]
    cpu_us_per_token = 1e6 * managed["cpu_s"] / max(managed["tokens"], 1)
    cores = managed["cpu_s"] / managed["s"]
    results.figures |= {
        "tokens_per_s_direct": direct_rate,
        "tokens_per_s_manager": managed_rate,
        "manager_cpu_us_per_token": cpu_us_per_token,
        "manager_cores_busy": cores,
        "manager_saturates_at_tokens_per_s": 1e6 / cpu_us_per_token if cpu_us_per_token else None,
        "requests_per_path": settings.manager_requests * settings.manager_slices,
        "tokens_per_request": settings.manager_tokens,
        "concurrency": settings.manager_concurrency,
    }
    results.table(
        "Two built-in engines on the device: direct vs through rollflow manager",
        ["path", "tokens/s", "manager CPU us/token", "manager cores busy", "failed requests"],
        [
            ["direct (client round robin)", round(direct_rate, 1), "", "", direct["failed"]],
            ["rollflow manager (round robin)", round(managed_rate, 1), round(cpu_us_per_token, 1),
             round(cores, 3), managed["failed"]],
        ],
    )  # fmt: skip
    print(f"  direct {direct_rate:.0f} tokens/s, through the manager {managed_rate:.0f} tokens/s; manager "
          f"{cpu_us_per_token:.1f} us CPU per token ({cores:.2f} cores busy)")  # fmt: skip
    results.goal("failed or short requests", direct["failed"] + managed["failed"], "==", 0)
    if settings.device.startswith("cuda"):
        results.goal(
            "tokens/s manager / direct", managed_rate / direct_rate, ">=", MIN_THROUGHPUT_RATIO, headline=True
        )
        results.goal("manager cores busy at the engines' token rate", cores, "<=", MAX_MANAGER_CORES)
