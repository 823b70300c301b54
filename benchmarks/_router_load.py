"""The load and the processes the router benchmarks share (manager_overhead.py, stream_relay.py,
vllm_router.py): canned engines and sglang-router started on 127.0.0.1 (the manager is servers.py's), a load
generator whose failed requests fail the run, the options that size its load, and each process's
CPU time."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import orjson

from benchmarks._peer_routers import SGLANG_ROUTER
from rollflow.runtime.launch.process import free_port
from rollflow.runtime.launch.servers import ServerProcess

REPO = Path(__file__).resolve().parents[1]
JSON = {"Content-Type": "application/json"}  # sglang-router refuses a body without it (415)


LOAD_OPTIONS = {
    "rounds": "rounds over every path, each round another path first",
    "requests": "sequential requests per path for latency, 4x this for throughput",
    "concurrency": "requests in flight for throughput",
    "stream_requests": "long streamed requests per path and round",
    "stream_concurrency": "long streams in flight",
    "stream_tokens": "tokens each long stream asks for",
}
"""The inputs that size a router benchmark's load: rounds, short requests one at a time (latency)
and `concurrency` at a time (throughput), then long streams."""


def start_canned_engine(
    log_dir: Path, name: str, tokens_per_event: int, events_per_write: int = 1
) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, str(REPO / "benchmarks" / "canned_engine.py"), "--port", str(port)]
    argv += ["--tokens-per-event", str(tokens_per_event), "--events-per-write", str(events_per_write)]
    return ServerProcess(argv, port, log_dir / f"{name}.log")


def sglang_router_argv(interpreter: Path, worker_urls: list[str], port: int) -> list[str]:
    options = ("--policy", "round_robin", "--disable-health-check")
    return SGLANG_ROUTER.argv(interpreter, worker_urls, port, free_port(), *options)


def start_sglang_router(interpreter: Path, worker_urls: list[str], log_dir: Path) -> ServerProcess:
    port = free_port()
    return ServerProcess(
        sglang_router_argv(interpreter, worker_urls, port), port, log_dir / "sglang-router.log"
    )


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process has run so far, all its threads (those that exited too), to the
    nanosecond: the process's CPU-time clock (Linux's CPUCLOCK_SCHED for `pid`). /proc's utime and
    stime count 10 ms ticks, too coarse for the few hundred requests of a short run."""
    return time.clock_gettime(((~pid) << 3) | 2)


class Client:
    """The load generator's requests: SGLang's `/generate`, `tokens` tokens each, with logprobs,
    streamed or not (another API's client overrides `path`, `body` and `whole`). A request that
    fails (an error status, a broken connection, an answer short of its tokens) is counted in
    `failures`, which fail the run, rather than ending it without a results file."""

    path = "/generate"

    def __init__(self, tokens: int, stream: bool, failures: list[str] | None = None) -> None:
        self.tokens = tokens
        self.stream = stream
        self.failures: list[str] = [] if failures is None else failures

    def body(self, prompt: list[int]) -> dict:
        sampling = {"max_new_tokens": self.tokens, "temperature": 0}
        return {
            "input_ids": prompt,
            "sampling_params": sampling,
            "stream": self.stream,
            "return_logprob": True,
        }

    def whole(self, raw: bytes) -> bool:
        """Whether the answer holds the tokens asked for and ended."""
        # a stream's last event before [DONE] holds the count so far (SGLang's completion_tokens)
        try:
            last = raw.rstrip().rsplit(b"data: ", 2)[-2] if self.stream else raw
            meta = orjson.loads(last)["meta_info"]
            return meta["completion_tokens"] == self.tokens and meta["finish_reason"] is not None
        except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
            return False

    async def one(self, session: aiohttp.ClientSession, url: str, prompt: list[int]) -> float | None:
        """Seconds until the whole answer is in; None (and a failure noted) when it is not the
        tokens asked for."""
        started = time.perf_counter()
        try:
            data = orjson.dumps(self.body(prompt))
            async with session.post(url + self.path, data=data, headers=JSON) as response:
                raw = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.failures.append(f"{url}: {exc!r}")
            return None
        elapsed = time.perf_counter() - started
        if response.status != 200 or not self.whole(raw):
            self.failures.append(f"{url}: bad answer {response.status}: {raw[-300:]!r}")
            return None
        return elapsed


async def load(
    client: Client, session: aiohttp.ClientSession, url: str, requests: int, concurrency: int
) -> None:
    """`requests` requests, `concurrency` of them in flight at a time."""
    left = list(range(requests))

    async def worker() -> None:
        while left:
            await client.one(session, url, [4, 5, left.pop() % 50])

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def in_turn(names: list[str], turn: int) -> list[str]:
    """The paths in the order they take `turn`: each turn another one starts."""
    first = turn % len(names)
    return names[first:] + names[:first]


async def warm_up(client: Client, session: aiohttp.ClientSession, url: str) -> None:
    """Open connections and fill caches before anything is timed."""
    for _ in range(50):
        await client.one(session, url, [1, 2, 3])


def median(values: list[float]) -> float:
    """The median, NaN for no values (every request of a path failed: its goals then miss)."""
    return statistics.median(values) if values else float("nan")


def p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))] if values else float("nan")


def tree_cpu_seconds(pid: int) -> float:
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
