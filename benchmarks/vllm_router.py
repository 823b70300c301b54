"""What the rollout manager adds on vLLM's token-in/token-out generate, against vllm-router on the
same engines and load.

    python benchmarks/vllm_router.py [--quick] [--rounds 3] [--requests 300] [--concurrency 32]
        [--tokens 64] [--results-dir benchmarks/results]

The peer is vllm-router at the version `benchmarks/_vllm_router.py` pins (a Rust router in a
wheel), installed by this benchmark into `.venv-vllm-router/` on first use (it needs PyPI then;
without the peer the run fails).

The engines are two `benchmarks/canned_engine.py` processes answering as vLLM 0.32 does, with no
model, so the engines are never the bound and what is measured is what a router adds. Every request
is what SkyRL's `RemoteInferenceClient` sends through its router: `POST /inference/v1/generate` with
`{"token_ids", "sampling_params": {"max_tokens": --tokens, "logprobs": 0, ...}, "model"}`, one JSON
answer back, its `--tokens` token ids and logprobs checked. Three paths get the same requests:
direct to one engine, through vllm-router, and through `rollflow manager serve`, both routers
round robin over both engines. They do not do the same work: vllm-router forwards the engine's
one JSON body, while the manager streams every request's tokens from its engine (vLLM's
`/v1/completions`, one event per token) and records each, so a request whose engine dies finishes
on another from the tokens it has. What that costs per request is what this run measures.

Latency p50/p99 at concurrency 1, each request sent to every path in turn (paired samples; the
added latency is a path's minus the direct path's); then requests/s at `--concurrency`, the load in
slices with the paths taking turns slice by slice, and the CPU time the router's processes (its
process and every process under it, summed) and the engines spent per request (each process's
CPU-time clock, which a busy machine barely touches). Taking turns lets the machine's drifting
speed reach every path alike; `--rounds` repeats all of it, each round another path first. The load
generator, engines and routers share this machine's cores, so requests/s falls with the CPU any of
them spends.

Goals: no request failed or came back short; the manager's router CPU per request at most
--cpu-ratio-goal times vllm-router's (median over rounds); the peer ran. `--quick` runs 2 rounds of
fewer requests (about a minute); an option given on the command line wins over it. Writes
`vllm_router.json` into `--results-dir` (see benchmarks/results.py) and exits non-zero on a missed
goal.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import _vllm_router  # noqa: E402
from benchmarks.results import Results, add_results_dir, results_dir  # noqa: E402
from tests.runtime.processes import Process, free_port, rollflow  # noqa: E402

JSON = {"Content-Type": "application/json"}  # vllm-router refuses a body without it (415)
DIRECT, MANAGER, PEER = "direct (one engine)", "rollflow manager", "vllm-router"
THROUGHPUT_SLICES = 4  # turns each path takes per round in the throughput phase
WARM_UP_REQUESTS = 50
CPU_RATIO_GOAL = 12.0
"""The manager's router CPU per request over vllm-router's, at most. Measured on 2 shared cores at 64
tokens a request: about 10x (1.2 ms against 0.12 ms), the manager parsing and recording 64 streamed
events where vllm-router forwards one body; the goal holds that ratio from growing."""


class Client:
    """SkyRL's generate requests, `tokens` tokens each with their logprobs. A request that fails (an
    error status, a broken connection, an answer short of its tokens) is counted in `failures`,
    which fail the run, rather than ending it without a results file."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.failures: list[str] = []

    async def one(self, session: aiohttp.ClientSession, url: str, prompt: list[int]) -> float | None:
        """Seconds until the whole answer is in; None (and a failure noted) when it is not the
        tokens asked for."""
        sampling = {"max_tokens": self.tokens, "temperature": 1.0, "logprobs": 0, "skip_special_tokens": True}
        body = {"token_ids": prompt, "sampling_params": sampling, "model": "canned"}
        started = time.perf_counter()
        try:
            async with session.post(
                url + "/inference/v1/generate", data=orjson.dumps(body), headers=JSON
            ) as response:
                raw = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.failures.append(f"{url}: {exc!r}")
            return None
        elapsed = time.perf_counter() - started
        try:
            (choice,) = orjson.loads(raw)["choices"]
            good = (
                len(choice["token_ids"]) == self.tokens
                and len(choice["logprobs"]["content"]) == self.tokens
                and choice["finish_reason"] == "length"
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            good = False
        if response.status != 200 or not good:
            self.failures.append(f"{url}: bad answer {response.status}: {raw[-300:]!r}")
            return None
        return elapsed


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds the process `pid` and every process under it have run so far (all threads, to
    the nanosecond: each process's CPU-time clock, Linux's CPUCLOCK_SCHED), so a router that works
    in several processes is counted whole."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += time.clock_gettime(((~current) << 3) | 2)
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # it exited between two readings
            continue
    return total


def _in_turn(names: list[str], turn: int) -> list[str]:
    """The paths in the order they take `turn`: each turn another one starts."""
    first = turn % len(names)
    return names[first:] + names[:first]


async def _load(
    client: Client, session: aiohttp.ClientSession, url: str, requests: int, concurrency: int
) -> None:
    """`requests` requests, `concurrency` of them in flight at a time."""
    left = list(range(requests))

    async def worker() -> None:
        while left:
            await client.one(session, url, [4, 5, left.pop() % 50])

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _round(
    client: Client,
    paths: dict[str, tuple[str, int | None]],
    engine_pids: list[int],
    args: argparse.Namespace,
    first: int,
) -> dict[str, dict[str, float]]:
    """One round: paired latencies at concurrency 1, then requests/s and CPU per request at
    `args.concurrency`, path `first` starting each phase's turns."""
    names = _in_turn(list(paths), first)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    totals = {name: {"s": 0.0, "cpu": 0.0, "engines": 0.0} for name in names}
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) for name in names}
    try:
        for name in names:
            for _ in range(WARM_UP_REQUESTS):  # open connections and fill caches, untimed
                await client.one(sessions[name], paths[name][0], [1, 2, 3])
        for i in range(args.requests):
            for name in _in_turn(names, i):
                elapsed = await client.one(sessions[name], paths[name][0], [1, 2, 3, i % 50])
                if elapsed is not None:
                    latencies[name].append(elapsed)
        per_slice = 4 * args.requests // THROUGHPUT_SLICES
        for i in range(THROUGHPUT_SLICES):
            for name in _in_turn(names, i):
                url, pid = paths[name]
                cpu_before = _tree_cpu_seconds(pid) if pid else 0.0
                engines_before = sum(map(_tree_cpu_seconds, engine_pids))
                started = time.perf_counter()
                await _load(client, sessions[name], url, per_slice, args.concurrency)
                totals[name]["s"] += time.perf_counter() - started
                totals[name]["cpu"] += _tree_cpu_seconds(pid) - cpu_before if pid else 0.0
                totals[name]["engines"] += sum(map(_tree_cpu_seconds, engine_pids)) - engines_before
    finally:
        for session in sessions.values():
            await session.close()
    done = per_slice * THROUGHPUT_SLICES
    return {
        name: {
            "p50_ms": 1000 * _median(latencies[name]),
            "p99_ms": 1000 * _p99(latencies[name]),
            "rps": done / totals[name]["s"],
            "router_cpu_us": 1e6 * totals[name]["cpu"] / done,
            "engines_cpu_us": 1e6 * totals[name]["engines"] / done,
        }
        for name in paths
    }


def _median(values: list[float]) -> float:
    """The median, NaN for no values (every request of a path failed: its goals then miss)."""
    return statistics.median(values) if values else float("nan")


def _p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))] if values else float("nan")


def _start_manager(engine_urls: list[str], tmp: Path) -> Process:
    import yaml

    config = tmp / "manager.yaml"
    engines = [{"url": url, "engine_type": "vllm", "capacity": 1024} for url in engine_urls]
    config.write_text(yaml.safe_dump({"engines": engines, "router": "round_robin"}))
    port = free_port()
    argv = rollflow("manager", "serve", "--config", str(config), "--port", str(port))
    return Process(argv, port, tmp / "manager.log")


def _start_engine(tmp: Path, name: str) -> Process:
    port = free_port()
    argv = [sys.executable, str(REPO / "benchmarks" / "canned_engine.py"), "--port", str(port)]
    return Process(argv, port, tmp / f"{name}.log")


def run(args: argparse.Namespace, interpreter: Path, tmp: Path, results: Results) -> None:
    engines = [_start_engine(tmp, f"canned{i}") for i in range(2)]
    processes = list(engines)
    try:
        urls = [engine.url for engine in engines]
        manager = _start_manager(urls, tmp)
        processes.append(manager)
        port = free_port()
        argv = _vllm_router.router_argv(interpreter, urls, port, free_port(), "--policy", "round_robin")
        peer = Process(argv, port, tmp / "vllm-router.log")
        processes.append(peer)
        paths = {
            DIRECT: (urls[0], None),
            MANAGER: (manager.url, manager.proc.pid),
            PEER: (peer.url, peer.proc.pid),
        }
        client = Client(args.tokens)
        engine_pids = [engine.proc.pid for engine in engines]
        rounds = []
        for index in range(args.rounds):
            rounds.append(asyncio.run(_round(client, paths, engine_pids, args, index)))
            print(f"round {index + 1} of {args.rounds} done", flush=True)
    finally:
        for process in reversed(processes):
            process.stop()
    _report(args, client, rounds, results)


def _report(args: argparse.Namespace, client: Client, rounds: list[dict], results: Results) -> None:
    keys = ("p50_ms", "p99_ms", "rps", "router_cpu_us", "engines_cpu_us")
    columns = ["round", "path", "p50 ms", "p99 ms", "req/s", "router CPU us/req", "engines CPU us/req"]
    rows = [
        [index + 1, name, *(round(m[key], 3) for key in keys)]
        for index, row in enumerate(rounds)
        for name, m in row.items()
    ]
    results.table("Each round, each path", columns, rows)
    print(f"\n{'round':<6}{'path':<22}" + "".join(f"{c:>20}" for c in columns[2:]))
    for row in rows:
        print(f"{row[0]:<6}{row[1]:<22}" + "".join(f"{v:>20.3f}" for v in row[2:]))

    def median(name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in rounds)

    def added(name: str, key: str) -> float:
        return statistics.median(r[name][key] - r[DIRECT][key] for r in rounds)

    figures: dict[str, float] = {}
    for name, label in ((MANAGER, "manager"), (PEER, "vllm_router")):
        figures[f"{label}_added_p50_ms"] = added(name, "p50_ms")
        figures[f"{label}_added_p99_ms"] = added(name, "p99_ms")
        figures[f"{label}_rps"] = median(name, "rps")
        figures[f"{label}_router_cpu_us_per_request"] = median(name, "router_cpu_us")
        figures[f"{label}_router_cpu_us_per_token"] = median(name, "router_cpu_us") / args.tokens
        figures[f"{label}_engines_cpu_us_per_request"] = median(name, "engines_cpu_us")
    figures["direct_rps"] = median(DIRECT, "rps")
    cpu_ratios = [r[MANAGER]["router_cpu_us"] / r[PEER]["router_cpu_us"] for r in rounds]
    rps_ratios = [r[MANAGER]["rps"] / r[PEER]["rps"] for r in rounds]
    figures["router_cpu_per_request_manager_over_vllm_router"] = statistics.median(cpu_ratios)
    figures["requests_per_s_manager_over_vllm_router"] = statistics.median(rps_ratios)
    settings = {
        "rounds": args.rounds,
        "latency_requests": args.requests,
        "throughput_requests": 4 * args.requests // THROUGHPUT_SLICES * THROUGHPUT_SLICES,
        "concurrency": args.concurrency,
        "tokens_per_request": args.tokens,
        "engines": 2,
        "policy": "round_robin",
    }
    results.figures |= {"settings": settings, **figures, "rounds": rounds, "failures": client.failures[:20]}
    print()
    for key, value in figures.items():
        print(f"{key}: {value:.3f}")
    for failure in client.failures[:5]:
        print(f"failed: {failure}")
    results.goal("requests failed or short of their tokens", len(client.failures), "==", 0)
    results.goal(
        "router CPU per request manager / vllm-router, median over rounds",
        figures["router_cpu_per_request_manager_over_vllm_router"],
        "<=",
        args.cpu_ratio_goal,
        headline=True,
    )


FULL = {"rounds": 3, "requests": 300, "concurrency": 32}
QUICK = FULL | {"rounds": 2, "requests": 60, "concurrency": 16}
"""Inputs of a run and of a `--quick` one; an option given on the command line wins over both."""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, help=f"rounds over every path ({FULL['rounds']})")
    parser.add_argument(
        "--requests",
        type=int,
        help=f"sequential requests per path for latency (4x this for throughput; {FULL['requests']})",
    )
    parser.add_argument(
        "--concurrency", type=int, help=f"requests in flight for throughput ({FULL['concurrency']})"
    )
    parser.add_argument("--tokens", type=int, default=64, help="tokens each request asks for")
    parser.add_argument(
        "--cpu-ratio-goal",
        type=float,
        default=CPU_RATIO_GOAL,
        help="the manager's router CPU per request over vllm-router's, at most",
    )
    add_results_dir(parser)
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.rounds, args.requests, args.concurrency, args.tokens) < 1:
        parser.error("--rounds, --requests, --concurrency and --tokens must be at least 1")
    results = Results("vllm_router", results_dir(args))
    interpreter = _vllm_router.python()
    results.peers["vllm-router"] = _vllm_router.version(interpreter)
    with tempfile.TemporaryDirectory() as tmp:
        run(args, interpreter, Path(tmp), results)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
