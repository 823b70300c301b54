"""The manager's per-token cost and how it scales with `processes: N`, against sglang-router.

    python benchmarks/stream_relay.py [--quick] [--rounds 5] [--requests 512] [--concurrency 64]
        [--tokens 256] [--events-per-write 8] [--batch-prompts 96] [--results-dir benchmarks/results]

Model-free engines (`benchmarks/canned_engine.py`, each in its own process) stream one token per
server-sent event, in two modes: each event its own write, and `--events-per-write` events to a
write (as a busy engine's events reach its socket together). In front of each mode's pair of
engines run sglang-router (round robin, the version `_peer_routers.py` pins), the rollflow
manager as one process (which reads the engines' streams itself, once every `stream_flush_ms`),
and the manager with `processes: 2` (the manager and one stream process, which reads the engines'
streams and sends their tokens back merged every `stream_flush_ms`, sleeping in between).

Each round sends `--requests` streamed `/generate` requests of `--tokens` tokens at
`--concurrency` through every path (and straight to one engine, the path with no router), in
8 slices with the paths taking turns, each slice whole waves of `--concurrency` requests (a slice
of one and a half waves ran its second half at half the concurrency, where per-flush costs weigh
more per token; short slices in turn spread the machine's drift over every path alike). It
measures each path's tokens/s and its router's CPU per streamed token: every process of the
router, summed (the manager and its stream processes), from each process's CPU-time clock. Then
the manager's own batch API: `--batch-prompts` prompts x 4 samples of `--tokens` tokens through
each manager, as 4 `/batches` batches with the managers taking turns; the manager streams them
from the engines, as an RL trainer's rollouts run.

It prints the medians over rounds and the share of the manager's CPU spent in the process every
sample passes through (with `processes: 2`, the first), which is what bounds how far more stream
processes scale a manager: a share s lets N stream processes carry about 1/s times one core's
tokens before that process is the bound.

Goals (the run exits non-zero when one is missed, a request fails or comes back short, or
sglang-router did not run): the manager's CPU per streamed token at most 1.0x sglang-router's in
both modes, with the manager as it is best run for the mode (`processes: 1` or `2`, each reported);
with 2 processes, tokens per CPU-second within 10% of one process's (the stream process adds no
cost of its own). Five rounds by default: this machine's speed drifts by a tenth within minutes,
and with three the medians' ratio swung as much as the goal's margin. `--quick` runs 2 rounds and a
smaller /batches phase (about a minute and a half): the same requests, since the first process's
share is per request as much as per token (at 128 tokens a request it came out at 0.40-0.43).
Writes `stream_relay.json` into `--results-dir` (see benchmarks/results.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._peer_routers import SGLANG_ROUTER
from benchmarks._router_load import (
    Client,
    cpu_seconds,
    in_turn,
    load,
    median,
    start_canned_engine,
    start_sglang_router,
    tree_cpu_seconds,
    warm_up,
)
from benchmarks.results import Results, benchmark_parser, fill_inputs, results_dir
from rollflow.runtime.launch.servers import manager_config, start_manager
from rollflow.runtime.manager.client import ManagerClient

SLICES = 8  # turns each path takes per round
MANAGERS = {"rollflow, 1 process": 1, "rollflow, 2 processes": 2}
BATCH_N = 4
BATCH_SLICES = 4  # batches each manager runs per round, in turn


def _router_cpu(pid: int | None) -> tuple[float, float]:
    """CPU seconds of a router's first process, and of it with every process it started."""
    return (cpu_seconds(pid), tree_cpu_seconds(pid)) if pid else (0.0, 0.0)


class _Turns:
    """Each path's wall seconds and router CPU seconds (its first process, all its processes),
    summed over the turns it takes."""

    def __init__(self, names: list[str]) -> None:
        self.totals = {name: {"s": 0.0, "first": 0.0, "all": 0.0} for name in names}

    @contextlib.contextmanager
    def turn(self, name: str, pid: int | None) -> Iterator[None]:
        """Count what the body spends as one of `name`'s turns (`pid`: its router's, None for none)."""
        first, whole = _router_cpu(pid)
        started = time.perf_counter()
        yield
        total = self.totals[name]
        total["s"] += time.perf_counter() - started
        first_after, whole_after = _router_cpu(pid)
        total["first"] += first_after - first
        total["all"] += whole_after - whole

    def figures(self, tokens: int, routed: dict[str, bool]) -> dict[str, dict]:
        """Every path's figures, each having carried `tokens` over its turns."""
        return {
            name: _figures(tokens, t["s"], t["first"], t["all"], routed[name])
            for name, t in self.totals.items()
        }


async def _streams(
    client: Client, paths: dict[str, tuple[str, int | None]], requests: int, concurrency: int
) -> dict[str, dict]:
    """Tokens/s and router CPU per token of each path (its url and its router's pid), the paths
    taking turns slice by slice."""
    per_slice = requests // SLICES
    turns = _Turns(list(paths))
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) for name in paths}
    try:
        for name, (url, _) in paths.items():
            await warm_up(client, sessions[name], url)
        for turn in range(SLICES):
            for name in in_turn(list(paths), turn):
                url, pid = paths[name]
                with turns.turn(name, pid):
                    await load(client, sessions[name], url, per_slice, concurrency)
    finally:
        for session in sessions.values():
            await session.close()
    return turns.figures(
        per_slice * SLICES * client.tokens, {name: pid is not None for name, (_, pid) in paths.items()}
    )


def _figures(tokens: int, seconds: float, first_cpu: float, all_cpu: float, routed: bool) -> dict:
    """A path's figures from its tokens, wall seconds, and the CPU seconds of its router's first
    process and of all its processes (none for the path with no router)."""
    return {
        "tokens_per_s": tokens / seconds,
        "cpu_us_per_token": 1e6 * all_cpu / tokens if routed else None,
        "first_process_cpu_share": first_cpu / all_cpu if routed and all_cpu > 0 else None,
    }


def _batches(managers: dict[str, tuple[str, int]], prompts: int, tokens: int, failures: list[str]) -> dict:
    """`prompts` prompts of `/batches` through each manager, as BATCH_SLICES batches with the
    managers taking turns: tokens/s and CPU per token."""
    per_batch = prompts // BATCH_SLICES
    turns = _Turns(list(managers))
    for turn in range(BATCH_SLICES):
        for name in in_turn(list(managers), turn):
            url, pid = managers[name]
            with turns.turn(name, pid):
                batch = ManagerClient(url).submit(
                    [[4, 5, i % 50] for i in range(per_batch)], n=BATCH_N, max_new_tokens=tokens
                )
                samples = [
                    sample
                    for micro_batch in batch.micro_batches()
                    for group in micro_batch
                    for sample in group
                ]
            short = [s for s in samples if s["state"] != "finished" or len(s["output_ids"]) != tokens]
            if len(samples) != per_batch * BATCH_N or short:
                failures.append(
                    f"{name} /batches: {len(samples)} samples, {len(short)} short or not finished"
                )
    return turns.figures(per_batch * BATCH_SLICES * BATCH_N * tokens, dict.fromkeys(managers, True))


def run(args: argparse.Namespace, tmp: Path, results: Results) -> None:
    modes = {"one event per write": 1, f"{args.events_per_write} events per write": args.events_per_write}
    started: list = []
    rounds: list[dict[str, dict[str, dict]]] = []
    client = Client(args.tokens, stream=True)
    failures: list[str] = []
    try:
        setups = {}
        for mode, events_per_write in modes.items():
            folder = tmp / f"epw{events_per_write}"
            folder.mkdir()
            engines = [start_canned_engine(folder, f"canned{i}", 1, events_per_write) for i in range(2)]
            urls = [engine.url for engine in engines]
            routers = {"sglang-router": start_sglang_router(args.sglang_router_python, urls, folder)}
            for name, count in MANAGERS.items():
                (folder / str(count)).mkdir()
                flush = {} if args.stream_flush_ms is None else {"stream_flush_ms": args.stream_flush_ms}
                config = manager_config(urls, router="round_robin", processes=count, **flush)
                routers[name] = start_manager(config, folder / str(count))
            started += [*engines, *routers.values()]
            paths: dict[str, tuple[str, int | None]] = {"direct (one engine)": (urls[0], None)}
            paths |= {name: (router.url, router.proc.pid) for name, router in routers.items()}
            setups[mode] = paths
        for index in range(args.rounds):
            row: dict[str, dict[str, dict]] = {}
            for mode, paths in setups.items():
                ordered = dict(
                    list(paths.items())[:1] + list(paths.items())[1:][:: 1 if index % 2 == 0 else -1]
                )
                row[mode] = asyncio.run(_streams(client, ordered, args.requests, args.concurrency))
            managers = {name: setups[next(iter(modes))][name] for name in MANAGERS}
            if index % 2:
                managers = dict(reversed(managers.items()))
            row["/batches, one event per write"] = _batches(
                managers, args.batch_prompts, args.tokens, failures
            )
            rounds.append(row)
            print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for process in started:
            process.stop()
    failures += client.failures
    for failure in failures[:5]:
        print(f"FAILED {failure}", file=sys.stderr)
    results.goal("requests or samples that failed or came back short", len(failures), "==", 0)
    _report(rounds, list(modes), results)


def _report(rounds: list[dict[str, dict[str, dict]]], modes: list[str], results: Results) -> None:
    results.figures["rounds"] = rounds
    medians: dict[str, dict[str, dict]] = {}
    for phase in rounds[0]:
        medians[phase] = {}
        for path in rounds[0][phase]:
            medians[phase][path] = {
                key: median([r[phase][path][key] for r in rounds if r[phase][path][key] is not None])
                if rounds[0][phase][path][key] is not None
                else None
                for key in rounds[0][phase][path]
            }
    results.figures["medians"] = medians
    rows = [
        [
            phase,
            path,
            round(f["tokens_per_s"]),
            round(f["cpu_us_per_token"], 2) if f["cpu_us_per_token"] is not None else "-",
            f"{100 * f['first_process_cpu_share']:.0f}%" if f["first_process_cpu_share"] is not None else "-",
        ]
        for phase, paths in medians.items()
        for path, f in paths.items()
    ]
    columns = ["phase", "path", "tokens/s", "router CPU us/token", "first process's share"]
    results.table("Per path, medians over rounds", columns, rows)
    print(f"{'phase':<34} {'path':<24} {'tokens/s':>10} {'CPU us/token':>13} {'first process':>14}")
    for row in rows:
        print(f"{row[0]:<34} {row[1]:<24} {row[2]:>10} {row[3]:>13} {row[4]:>14}")
    for mode in modes:
        peer = medians[mode]["sglang-router"]["cpu_us_per_token"]
        best = min(MANAGERS, key=lambda name: medians[mode][name]["cpu_us_per_token"])
        ratio = medians[mode][best]["cpu_us_per_token"] / peer
        results.figures[f"best manager, {mode}"] = best
        results.goal(
            f"manager CPU per streamed token / sglang-router's, {mode} ({best})",
            round(ratio, 3),
            "<=",
            1.0,
            headline=mode == modes[0],
        )
    sizing: dict[str, dict[str, float]] = {}
    for phase in medians:
        one, two = (medians[phase][name] for name in MANAGERS)
        ratio = two["cpu_us_per_token"] / one["cpu_us_per_token"]
        results.goal(f"CPU per token, 2 processes / 1 process, {phase}", round(ratio, 3), "<=", 1.1)
        share = two["first_process_cpu_share"]
        results.goal(
            f"first process's share of the manager's CPU, 2 processes, {phase}", round(share, 3), "<=", 0.4
        )
        sizing[phase] = _sizing(one["cpu_us_per_token"], two["cpu_us_per_token"], share)
    results.figures["sizing"] = sizing
    columns = [
        "phase",
        "tokens/s, 1 process (one core)",
        "tokens/s before the first process fills its core",
        "tokens/s, 16-core node",
        "cores for 64 GPUs at 15k tokens/s",
    ]
    results.table(
        "Sizing from the measured costs",
        columns,
        [[phase, *f.values()] for phase, f in sizing.items()],
    )


def _sizing(one_cpu_us: float, many_cpu_us: float, share: float) -> dict[str, float]:
    """What the measured costs imply for a node and a cluster: the first process fills its core at
    1 / (share x CPU per token) tokens/s, whatever the number of stream processes; below that, a
    manager needs CPU per token x tokens/s cores."""
    first_process_limit = 1e6 / (share * many_cpu_us)
    return {
        "tokens_per_s_one_process": round(1e6 / one_cpu_us),
        "tokens_per_s_before_the_first_process_fills_its_core": round(first_process_limit),
        "tokens_per_s_16_core_node": round(min(16e6 / many_cpu_us, first_process_limit)),
        "cores_for_64_gpus_at_15k_tokens_per_s": round(64 * 15_000 * many_cpu_us / 1e6, 1),
    }


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--rounds", type=int, help="repeats of every phase (default 5; 2 with --quick)")
    parser.add_argument(
        "--requests",
        type=int,
        help=f"streamed requests per path and round, a multiple of {SLICES} x --concurrency (default 512)",
    )
    parser.add_argument("--concurrency", type=int, default=64, help="streamed requests in flight")
    parser.add_argument("--tokens", type=int, help="tokens per request (default 256)")
    parser.add_argument("--events-per-write", type=int, default=8, help="events per write of the second mode")
    parser.add_argument(
        "--batch-prompts", type=int, help="prompts of the /batches phase (x4 samples; default 96)"
    )
    parser.add_argument(
        "--stream-flush-ms", type=float, help="the managers' stream_flush_ms (default: the manager's default)"
    )
    args = parser.parse_args()
    quick = {"rounds": 2, "requests": 512, "tokens": 256, "batch_prompts": 32}
    full = {"rounds": 5, "requests": 512, "tokens": 256, "batch_prompts": 96}
    fill_inputs(args, full, quick)
    if args.batch_prompts < BATCH_SLICES or args.batch_prompts % BATCH_SLICES:
        parser.error(
            f"--batch-prompts must be a positive multiple of {BATCH_SLICES}; got {args.batch_prompts}"
        )
    if args.concurrency < 1 or args.requests < 1 or args.requests % (SLICES * args.concurrency):
        parser.error(
            f"--requests must be a positive multiple of {SLICES} x --concurrency ({SLICES * args.concurrency}),"
            f" so that every slice runs whole waves of --concurrency requests; got {args.requests}"
        )
    args.sglang_router_python = SGLANG_ROUTER.python()
    results = Results("stream_relay", results_dir(args))
    results.peers["sglang-router"] = SGLANG_ROUTER.installed_version(args.sglang_router_python)
    results.figures["settings"] = {
        key: getattr(args, key)
        for key in (
            "rounds",
            "requests",
            "concurrency",
            "tokens",
            "events_per_write",
            "batch_prompts",
            "stream_flush_ms",
        )
    }
    with tempfile.TemporaryDirectory(prefix="stream-relay-") as tmp:
        run(args, Path(tmp), results)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
