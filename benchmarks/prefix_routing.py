"""Prefix-aware routing live: GRPO groups on built-in engines with prefix caches, router by router.

    python benchmarks/prefix_routing.py [--groups 6] [--group-size 8] [--engines 3]

A GRPO-shaped burst: `--groups` prompts, each sent `--group-size` times at once, every prompt
starting with the same 32-token system prompt followed by 64 tokens of its own, 16 tokens
generated greedily per sample. The burst goes through `rollflow manager` with `round_robin`, `lor`
and `prefix_affinity`, and through the `sglang-router` package with `--policy cache_aware` (the
peer), all in front of the same built-in engines (each configuration gets a system prompt of its
own, so no run finds another's prefixes cached). Per configuration it prints the prefix hit rate
(1 - the prompt tokens the engines' prefills computed, from their `/v1/loads`, over all prompt
tokens), those prompt tokens computed, TTFT p50/p99 (request sent to first
streamed token) and the burst's samples per second; then the simulator's prediction of the hit
rate and prefill tokens for the same traffic on the same number of replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.runtime.processes import ENV, Process, free_port, http, rollflow, start_engine  # noqa: E402

SYSTEM_TOKENS, OWN_TOKENS, NEW_TOKENS = 32, 64, 16
ROUTERS = ("round_robin", "lor", "prefix_affinity")


def _prompts(run: int, groups: int) -> list[list[int]]:
    """Prompts of one configuration: its own system prompt, then each group's own tokens."""
    system = [1 + (run * 37 + i) % 500 for i in range(SYSTEM_TOKENS)]
    return [system + [1 + (run * 101 + g * 67 + i) % 500 for i in range(OWN_TOKENS)] for g in range(groups)]


def _prefill_computed(engines: list[Process]) -> int:
    """Prompt tokens the engines' prefills computed so far (the rest came from their caches)."""
    return sum(http("GET", e.url + "/v1/loads")[1]["loads"][0]["prefill_tokens_computed"] for e in engines)


async def _burst(url: str, prompts: list[list[int]], group_size: int) -> tuple[list[float], float]:
    """Send every sample at once, streamed; (TTFT of each, seconds for the whole burst)."""

    async def one(session: aiohttp.ClientSession, prompt: list[int]) -> float:
        body = {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
            "stream": True,
        }
        started = time.perf_counter()
        ttft = None
        async with session.post(url + "/generate", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"{url}: HTTP {response.status}: {await response.text()}")
            async for line in response.content:
                if ttft is None and line.startswith(b"data: {") and json.loads(line[6:]).get("output_ids"):
                    ttft = time.perf_counter() - started
        if ttft is None:
            raise RuntimeError(f"{url}: a stream ended without a token")
        return ttft

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        ttfts = await asyncio.gather(*(one(session, prompt) for prompt in prompts for _ in range(group_size)))
        elapsed = time.perf_counter() - started
    return list(ttfts), elapsed


def _start_manager(router: str, engines: list[Process], tmp: Path) -> Process:
    import yaml

    port = free_port()
    path = tmp / f"manager-{router}.yaml"
    entries = [{"url": e.url, "engine_type": "builtin", "capacity": 8} for e in engines]
    path.write_text(yaml.safe_dump({"router": router, "engines": entries}))
    argv = rollflow("manager", "serve", "--config", str(path), "--port", str(port))
    return Process(argv, port, tmp / f"manager-{router}.log")


def _start_sglang_router(engines: list[Process], tmp: Path) -> Process:
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--policy", "cache_aware", "--worker-urls", *(e.url for e in engines), "--disable-health-check"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn"]
    return Process(argv, port, tmp / "sglang-router.log")


def _simulated(router: str, groups: int, group_size: int, replicas: int) -> tuple[float, int]:
    """The simulator's (prefix hit rate, prefill tokens computed) for the same burst."""
    from rollflow.sim.metrics import request_table, summarize
    from rollflow.sim.simulator import ServingSimulator
    from rollflow.sim.workload import build_requests
    from tests.factories import make_config

    config = make_config(
        f"cluster.replicas={replicas}",
        f"cluster.router={router}",
        "cluster.dispatch=late_binding",
        "cluster.capacity=8",
        "scheduler.prefix_caching=true",
        "workload.kind=synthetic",
        f"workload.num_requests={groups}",
        f"workload.groups.size={group_size}",
        f"workload.system_prompt_tokens={SYSTEM_TOKENS}",
        "workload.lengths.kind=fixed",
        f"workload.lengths.prefill_tokens={OWN_TOKENS}",
        f"workload.lengths.decode_tokens={NEW_TOKENS}",
        "workload.intervals.kind=static",
    )
    result = ServingSimulator(config, build_requests(config.workload, config.seed)).run()
    summary = summarize(result, request_table(result), 0.0)
    prompt_tokens = groups * group_size * (SYSTEM_TOKENS + OWN_TOKENS)
    return summary["prefix_hit_rate"], round((1 - summary["prefix_hit_rate"]) * prompt_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--engines", type=int, default=3)
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = tmp / "model"
        subprocess.run(rollflow("engine", "init-model", str(model)), env=ENV, check=True, capture_output=True)
        engines = [start_engine(model, tmp, name=f"engine{i}", wait=False) for i in range(args.engines)]
        try:
            for engine in engines:
                engine.wait_ready()
            configs = [(f"manager {r}", lambda r=r: _start_manager(r, engines, tmp)) for r in ROUTERS]
            configs.append(("sglang-router cache_aware", lambda: _start_sglang_router(engines, tmp)))
            for run, (name, start) in enumerate(configs):
                front = start()
                try:
                    prompts = _prompts(run, args.groups)
                    before = _prefill_computed(engines)
                    ttfts, elapsed = asyncio.run(_burst(front.url, prompts, args.group_size))
                    computed = _prefill_computed(engines) - before
                except RuntimeError as exc:  # the peer's requests refused by the engines, say
                    rows[name] = {"error": str(exc)[:300]}
                    continue
                finally:
                    front.stop()
                prompt_tokens = args.groups * args.group_size * (SYSTEM_TOKENS + OWN_TOKENS)
                ttfts.sort()
                rows[name] = {
                    "hit_rate": 1 - computed / prompt_tokens,
                    "computed": computed,
                    "ttft_p50_ms": 1000 * statistics.median(ttfts),
                    "ttft_p99_ms": 1000 * ttfts[int(0.99 * (len(ttfts) - 1))],
                    "samples_per_s": len(ttfts) / elapsed,
                }
        finally:
            for engine in engines:
                engine.stop()
    samples = args.groups * args.group_size
    print(
        f"\n{args.groups} groups x {args.group_size} samples, prompts of {SYSTEM_TOKENS} shared + "
        f"{OWN_TOKENS} own tokens, {NEW_TOKENS} generated, {args.engines} built-in engines (one run)"
    )
    header = f"{'front':<28}{'hit rate':>10}{'prefill tok':>13}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}{'samples/s':>11}"
    print(header)
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<28}failed: {row['error']}")
            continue
        print(
            f"{name:<28}{row['hit_rate']:>10.3f}{row['computed']:>13}{row['ttft_p50_ms']:>13.0f}"
            f"{row['ttft_p99_ms']:>13.0f}{row['samples_per_s']:>11.1f}"
        )
    print(f"\nsimulator, same burst ({samples} requests, {args.engines} replicas, exact prefix cache):")
    for router in ROUTERS:
        hit_rate, computed = _simulated(router, args.groups, args.group_size, args.engines)
        print(f"{router:<28}{hit_rate:>10.3f}{computed:>13}")


if __name__ == "__main__":
    main()
