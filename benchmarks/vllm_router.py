"""What the rollout manager adds on vLLM's token-in/token-out generate, against vllm-router on the
same engines and load.

    python benchmarks/vllm_router.py [--quick] [--rounds 3] [--requests 300] [--concurrency 32]
        [--tokens 64] [--stream-requests 256] [--stream-concurrency 32] [--stream-tokens 256]
        [--results-dir benchmarks/results]

The peer is vllm-router at the version `benchmarks/_peer_routers.py` pins (a Rust router in a
wheel), installed by this benchmark into `.venv-vllm-router/` on first use (it needs PyPI then;
without the peer the run fails).

The engines are two `benchmarks/canned_engine.py` processes answering as vLLM 0.32 does, with no
model, so the engines are never the bound and what is measured is what a router adds. Every request
is what SkyRL's `RemoteInferenceClient` sends through its router: `POST /inference/v1/generate` with
`{"token_ids", "sampling_params": {"max_tokens", "logprobs": 0, ...}, "model"}`, its token ids and
logprobs checked. Three paths get the same requests: direct to one engine, through vllm-router,
and through `rollflow manager serve`, both routers round robin over both engines.

Asked for one JSON answer (`--tokens` tokens, SkyRL's case), the two do not do the same work:
vllm-router forwards the engine's one JSON body, while the manager streams every request's tokens
from its engine (vLLM's `/v1/completions`, one event per token) and records each, so a request
whose engine dies finishes on another from the tokens it has. Asked for a stream (`stream: true`,
`--stream-tokens` tokens, one engine event per token), both handle every token's event: that is
the per-token comparison.

Each round: latency p50/p99 at concurrency 1 (JSON answers), each request sent to every path in
turn (paired samples; the added latency is a path's minus the direct path's); requests/s at
`--concurrency`, the load in slices with the paths taking turns slice by slice, and the CPU time
the router's processes (its process and every process under it, summed) and the engines spent per
request (each process's CPU-time clock, which a busy machine barely touches); then
`--stream-requests` streams at `--stream-concurrency`, in slices taken in turn as well: streamed
tokens/s and the router's CPU per streamed token. Taking turns lets the machine's drifting speed
reach every path alike; `--rounds` repeats all of it, each round another path first. The load
generator, engines and routers share this machine's cores, so throughput falls with the CPU any
of them spends.

Goals: no request failed or came back short; the manager's router CPU per JSON-answered request
at most `--cpu-ratio-goal` times vllm-router's and per streamed token at most
`--stream-cpu-ratio-goal` times (medians over rounds); the peer ran. `--quick` runs 2 rounds of
fewer, shorter requests (under a minute); an option given on the command line wins over it.
Writes `vllm_router.json` into `--results-dir` (see benchmarks/results.py) and exits non-zero on a
missed goal.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._peer_routers import VLLM_ROUTER
from benchmarks._router_load import (
    LOAD_OPTIONS,
    in_turn,
    load,
    median,
    p99,
    start_canned_engine,
    tree_cpu_seconds,
)
from benchmarks._router_load import (
    Client as SGLangClient,
)
from benchmarks.results import Results, add_inputs, benchmark_parser, fill_inputs, results_dir
from rollflow.runtime.launch.process import free_port
from rollflow.runtime.launch.servers import ServerProcess, manager_config, start_manager

DIRECT, MANAGER, PEER = "direct (one engine)", "rollflow manager", "vllm-router"
PATHS = (DIRECT, MANAGER, PEER)  # the order the tables list them in
THROUGHPUT_SLICES = 4  # turns each path takes per round in the throughput phase
WARM_UP_REQUESTS = 50
CPU_RATIO_GOAL = 12.0
"""The manager's router CPU per request over vllm-router's, at most. Measured on 2 shared cores at 64
tokens a request: about 10x (1.2 ms against 0.12 ms), the manager parsing and recording 64 streamed
events where vllm-router forwards one body; the goal holds that ratio from growing."""
STREAM_CPU_RATIO_GOAL = 4.0
"""The manager's router CPU per streamed token over vllm-router's, at most, where both handle every
token's event. Measured on 2 shared cores at 256 tokens a stream: about 3x (12-14 us against 4 us);
the manager parses each vLLM event (in Python) and records its token, vllm-router forwards bytes."""


class Client(SGLangClient):
    """SkyRL's generate requests, `tokens` tokens each with their logprobs, answered in one JSON body
    or (`stream`) as vLLM's server-sent events; failures counted as the SGLang client counts them."""

    path = "/inference/v1/generate"

    def body(self, prompt: list[int]) -> dict:
        sampling = {"max_tokens": self.tokens, "temperature": 1.0, "logprobs": 0, "skip_special_tokens": True}
        return {"token_ids": prompt, "sampling_params": sampling, "model": "canned", "stream": self.stream}

    def whole(self, raw: bytes) -> bool:
        try:
            choices = _streamed_choices(raw) if self.stream else orjson.loads(raw)["choices"]
            return (
                sum(len(choice["token_ids"]) for choice in choices) == self.tokens
                and sum(len(choice["logprobs"]["content"]) for choice in choices) == self.tokens
                and choices[-1]["finish_reason"] == "length"
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
            return False


def _streamed_choices(raw: bytes) -> list[dict]:
    """The choices of a stream's events, in order; ValueError unless it ends with `data: [DONE]`."""
    *events, done = raw.strip().split(b"\n\n")
    if done != b"data: [DONE]":
        raise ValueError("the stream did not end with data: [DONE]")
    return [choice for event in events for choice in orjson.loads(event.removeprefix(b"data: "))["choices"]]


async def _loaded(
    client: Client,
    sessions: dict[str, aiohttp.ClientSession],
    paths: dict[str, tuple[str, int | None]],
    engine_pids: list[int],
    requests: int,
    concurrency: int,
) -> dict[str, dict[str, float]]:
    """`requests` per path at `concurrency` in THROUGHPUT_SLICES slices, the paths taking turns
    slice by slice: the seconds it took each path, and the CPU its router and the engines spent."""
    per_slice = requests // THROUGHPUT_SLICES
    totals = {name: {"s": 0.0, "cpu": 0.0, "engines": 0.0, "done": 0.0} for name in paths}
    for i in range(THROUGHPUT_SLICES):
        for name in in_turn(list(paths), i):
            url, pid = paths[name]
            cpu_before = tree_cpu_seconds(pid) if pid else 0.0
            engines_before = sum(map(tree_cpu_seconds, engine_pids))
            started = time.perf_counter()
            await load(client, sessions[name], url, per_slice, concurrency)
            totals[name]["s"] += time.perf_counter() - started
            totals[name]["cpu"] += tree_cpu_seconds(pid) - cpu_before if pid else 0.0
            totals[name]["engines"] += sum(map(tree_cpu_seconds, engine_pids)) - engines_before
            totals[name]["done"] += per_slice
    return totals


async def _round(
    clients: tuple[Client, Client],
    paths: dict[str, tuple[str, int | None]],
    engine_pids: list[int],
    args: argparse.Namespace,
    first: int,
) -> dict[str, dict[str, float]]:
    """One round, path `first` starting each phase's turns: paired latencies at concurrency 1,
    requests/s and CPU per request at `args.concurrency` (JSON answers), then long streams."""
    json_client, stream_client = clients
    paths = {name: paths[name] for name in in_turn(list(paths), first)}
    latencies: dict[str, list[float]] = {name: [] for name in paths}
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) for name in paths}
    try:
        for name, (url, _) in paths.items():
            for _ in range(WARM_UP_REQUESTS):  # open connections and fill caches, untimed
                await json_client.one(sessions[name], url, [1, 2, 3])
        for i in range(args.requests):
            for name in in_turn(list(paths), i):
                elapsed = await json_client.one(sessions[name], paths[name][0], [1, 2, 3, i % 50])
                if elapsed is not None:
                    latencies[name].append(elapsed)
        loaded = await _loaded(json_client, sessions, paths, engine_pids, 4 * args.requests, args.concurrency)
        streams = await _loaded(
            stream_client, sessions, paths, engine_pids, args.stream_requests, args.stream_concurrency
        )
    finally:
        for session in sessions.values():
            await session.close()
    tokens = stream_client.tokens
    return {
        name: {
            "p50_ms": 1000 * median(latencies[name]),
            "p99_ms": 1000 * p99(latencies[name]),
            "rps": loaded[name]["done"] / loaded[name]["s"],
            "router_cpu_us": 1e6 * loaded[name]["cpu"] / loaded[name]["done"],
            "engines_cpu_us": 1e6 * loaded[name]["engines"] / loaded[name]["done"],
            "stream_tokens_per_s": tokens * streams[name]["done"] / streams[name]["s"],
            "stream_router_cpu_us_per_token": 1e6 * streams[name]["cpu"] / (tokens * streams[name]["done"]),
        }
        for name in sorted(paths, key=list(PATHS).index)
    }


def run(args: argparse.Namespace, interpreter: Path, tmp: Path, results: Results) -> None:
    engines = [start_canned_engine(tmp, f"canned{i}", tokens_per_event=1) for i in range(2)]
    processes = list(engines)
    try:
        urls = [engine.url for engine in engines]
        manager = start_manager(manager_config(urls, engine_type="vllm", router="round_robin"), tmp)
        processes.append(manager)
        port = free_port()
        argv = VLLM_ROUTER.argv(interpreter, urls, port, free_port(), "--policy", "round_robin")
        peer = ServerProcess(argv, port, tmp / "vllm-router.log")
        processes.append(peer)
        paths = {
            DIRECT: (urls[0], None),
            MANAGER: (manager.url, manager.proc.pid),
            PEER: (peer.url, peer.proc.pid),
        }
        failures: list[str] = []
        clients = (Client(args.tokens, False, failures), Client(args.stream_tokens, True, failures))
        engine_pids = [engine.proc.pid for engine in engines]
        rounds = []
        for index in range(args.rounds):
            rounds.append(asyncio.run(_round(clients, paths, engine_pids, args, index)))
            print(f"round {index + 1} of {args.rounds} done", flush=True)
    finally:
        for process in reversed(processes):
            process.stop()
    _report(args, failures, rounds, results)


def _report(args: argparse.Namespace, failures: list[str], rounds: list[dict], results: Results) -> None:
    keys = (
        "p50_ms",
        "p99_ms",
        "rps",
        "router_cpu_us",
        "engines_cpu_us",
        "stream_tokens_per_s",
        "stream_router_cpu_us_per_token",
    )
    columns = ["round", "path", "p50 ms", "p99 ms", "req/s", "router CPU us/req", "engines CPU us/req"]
    columns += ["streamed tokens/s", "router CPU us/streamed token"]
    rows = [
        [index + 1, name, *(round(m[key], 3) for key in keys)]
        for index, row in enumerate(rounds)
        for name, m in row.items()
    ]
    results.table("Each round, each path", columns, rows)
    print(f"\n{'round':<6}{'path':<22}" + "".join(f"{c:>30}" for c in columns[2:]))
    for row in rows:
        print(f"{row[0]:<6}{row[1]:<22}" + "".join(f"{v:>30.3f}" for v in row[2:]))

    def median(name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in rounds)

    def added(name: str, key: str) -> float:
        return statistics.median(r[name][key] - r[DIRECT][key] for r in rounds)

    def ratio(key: str) -> float:
        return statistics.median(r[MANAGER][key] / r[PEER][key] for r in rounds)

    figures: dict[str, float] = {}
    for name, label in ((MANAGER, "manager"), (PEER, "vllm_router")):
        figures[f"{label}_added_p50_ms"] = added(name, "p50_ms")
        figures[f"{label}_added_p99_ms"] = added(name, "p99_ms")
        figures[f"{label}_rps"] = median(name, "rps")
        figures[f"{label}_router_cpu_us_per_request"] = median(name, "router_cpu_us")
        figures[f"{label}_engines_cpu_us_per_request"] = median(name, "engines_cpu_us")
        figures[f"{label}_streamed_tokens_per_s"] = median(name, "stream_tokens_per_s")
        figures[f"{label}_router_cpu_us_per_streamed_token"] = median(name, "stream_router_cpu_us_per_token")
    figures["direct_rps"] = median(DIRECT, "rps")
    figures["direct_streamed_tokens_per_s"] = median(DIRECT, "stream_tokens_per_s")
    figures["router_cpu_per_request_manager_over_vllm_router"] = ratio("router_cpu_us")
    figures["requests_per_s_manager_over_vllm_router"] = ratio("rps")
    figures["router_cpu_per_streamed_token_manager_over_vllm_router"] = ratio(
        "stream_router_cpu_us_per_token"
    )
    figures["streamed_tokens_per_s_manager_over_vllm_router"] = ratio("stream_tokens_per_s")
    settings = {
        "rounds": args.rounds,
        "latency_requests": args.requests,
        "json_requests": 4 * args.requests // THROUGHPUT_SLICES * THROUGHPUT_SLICES,
        "concurrency": args.concurrency,
        "tokens_per_request": args.tokens,
        "stream_requests": args.stream_requests // THROUGHPUT_SLICES * THROUGHPUT_SLICES,
        "stream_concurrency": args.stream_concurrency,
        "stream_tokens_per_request": args.stream_tokens,
        "engines": 2,
        "policy": "round_robin",
    }
    results.figures |= {"settings": settings, **figures, "rounds": rounds, "failures": failures[:20]}
    print()
    for key, value in figures.items():
        print(f"{key}: {value:.3f}")
    for failure in failures[:5]:
        print(f"failed: {failure}")
    results.goal("requests failed or short of their tokens", len(failures), "==", 0)
    results.goal(
        "router CPU per request manager / vllm-router, median over rounds",
        figures["router_cpu_per_request_manager_over_vllm_router"],
        "<=",
        args.cpu_ratio_goal,
        headline=True,
    )
    results.goal(
        "router CPU per streamed token manager / vllm-router, median over rounds",
        figures["router_cpu_per_streamed_token_manager_over_vllm_router"],
        "<=",
        args.stream_cpu_ratio_goal,
        headline=True,
    )


FULL = {
    "rounds": 3,
    "requests": 300,
    "concurrency": 32,
    "stream_requests": 256,
    "stream_concurrency": 32,
    "stream_tokens": 256,
}
QUICK = FULL | {
    "rounds": 2,
    "requests": 60,
    "concurrency": 16,
    "stream_requests": 64,
    "stream_concurrency": 16,
    "stream_tokens": 128,
}
"""Inputs of a run and of a `--quick` one; an option given on the command line wins over both."""


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_inputs(parser, FULL, LOAD_OPTIONS)
    parser.add_argument("--tokens", type=int, default=64, help="tokens each JSON-answered request asks for")
    parser.add_argument(
        "--cpu-ratio-goal",
        type=float,
        default=CPU_RATIO_GOAL,
        help="the manager's router CPU per JSON-answered request over vllm-router's, at most",
    )
    parser.add_argument(
        "--stream-cpu-ratio-goal",
        type=float,
        default=STREAM_CPU_RATIO_GOAL,
        help="the manager's router CPU per streamed token over vllm-router's, at most",
    )
    args = parser.parse_args()
    fill_inputs(args, FULL, QUICK)
    numbers = (
        args.rounds,
        args.requests,
        args.concurrency,
        args.tokens,
        args.stream_concurrency,
        args.stream_tokens,
    )
    if min(numbers) < 1 or args.stream_requests < THROUGHPUT_SLICES:
        parser.error(
            "--rounds, --requests, --concurrency, --tokens, --stream-concurrency and --stream-tokens must be "
            f"at least 1, --stream-requests at least {THROUGHPUT_SLICES}"
        )
    results = Results("vllm_router", results_dir(args))
    interpreter = VLLM_ROUTER.python()
    results.peers["vllm-router"] = VLLM_ROUTER.installed_version(interpreter)
    with tempfile.TemporaryDirectory() as tmp:
        run(args, interpreter, Path(tmp), results)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
