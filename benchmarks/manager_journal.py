"""What the manager's journal costs, and how fast a manager killed mid-batch is generating again.

    python benchmarks/manager_journal.py [--quick] [--batches 16] [--prompts 8] [--n 4] [--tokens 64]
        [--latency-batches 100] [--repeats 3] [--restart-samples 32] [--restart-tokens 2000]
        [--results-dir benchmarks/results]

The engines are two `benchmarks/canned_engine.py` processes that stream SGLang's /generate one token
per event (`--incremental-streaming-output`: each event holds its one new token) with no model
behind them, so the numbers are the manager's and its journal's, not a model's. Each run starts a
fresh `rollflow manager serve`,
with the journal on (the default flush interval) or off, and measures through `ManagerClient`:

- latency: one small batch at a time (1 prompt, n=1), submit -> its micro-batch received, p50/p99;
- throughput: `--batches` batches of `--prompts` x `--n` samples submitted at once, tokens/s until
  every micro-batch is received;
- CPU: the manager process's CPU seconds (all its threads, its CPU-time clock) per token over
  both, the journal's cost as the machine's other load touches it least (wall-clock ratios on a
  shared machine swing with whatever else runs).

Then the restart: a batch of `--restart-samples` long samples (engines slowed to 5 ms a token),
the manager killed with SIGKILL once an eighth of its tokens are in and started again on its
journal; printed are the time from starting the new process to it answering, and to its first
resumed token (generated again by the engines); the batch must then finish, every sample with all
its tokens.

`--quick` runs fewer batches, two repeats and a shorter restart batch (about a minute); an option given on the command line wins over it. Writes `manager_journal.json` into
`--results-dir` (see benchmarks/results.py) and exits non-zero when a goal is missed: the journal
costing 10% or more in throughput, added p50 latency or CPU per token (on/off medians), any run
receiving fewer or more tokens than it asked for, or a sample not finished whole after the restart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import Results, add_inputs, benchmark_parser, fill_inputs, results_dir
from rollflow.runtime.launch.process import free_port
from rollflow.runtime.launch.servers import ServerProcess, http, manager_config, start_manager
from rollflow.runtime.manager.client import ManagerClient

REPO = Path(__file__).resolve().parents[1]

MAX_COST = 0.10
"""The journal's goal: under 10% cost in throughput, added latency and CPU per token."""


def _start_engines(tmp: Path, token_delay_ms: float) -> list[ServerProcess]:
    """Two canned engines, each in its own process (not sharing the load generator's GIL)."""
    engines = []
    for _ in range(2):
        port = free_port()
        argv = [sys.executable, str(REPO / "benchmarks" / "canned_engine.py"), "--port", str(port)]
        argv += ["--incremental-streaming-output", "--token-delay-ms", str(token_delay_ms)]
        engines.append(ServerProcess(argv, port, tmp / f"engine-{port}.log"))
    return engines


def _start_manager(
    tmp: Path, engines: list[ServerProcess], journal: Path | None, port: int, name: str = "manager"
) -> ServerProcess:
    config = manager_config([e.url for e in engines], **({"journal": str(journal)} if journal else {}))
    return start_manager(config, tmp, port, name)


def _drain(client: ManagerClient, prompts: list[list[int]], n: int, tokens: int) -> int:
    batch = client.submit(prompts, n=n, max_new_tokens=tokens, temperature=0)
    return sum(len(s["output_ids"]) for mb in batch.micro_batches() for g in mb for s in g)


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has run so far, all its threads (those that exited too), to the
    nanosecond: the process's CPU-time clock (Linux's CPUCLOCK_SCHED for `pid`). /proc's utime and
    stime count 10 ms ticks, too coarse for a short run's few thousand tokens."""
    return time.clock_gettime(((~pid) << 3) | 2)


def measure(args: argparse.Namespace, tmp: Path, engines: list[ServerProcess], journal: bool) -> dict:
    port = free_port()
    manager = _start_manager(tmp, engines, tmp / f"journal-{port}.db" if journal else None, port)
    client = ManagerClient(manager.url)
    try:
        for _ in range(5):  # warm up
            _drain(client, [[1, 2, 3]], 1, args.tokens)
        cpu_started = _cpu_s(manager.proc.pid)
        latencies = []
        received = 0
        for i in range(args.latency_batches):
            started = time.perf_counter()
            received += _drain(client, [[1, 2, i % 50]], 1, args.tokens)
            latencies.append(time.perf_counter() - started)
        prompts = [[4, 5, i] for i in range(args.prompts)]
        started = time.perf_counter()
        with ThreadPoolExecutor(args.batches) as pool:
            tokens = sum(
                pool.map(lambda _: _drain(client, prompts, args.n, args.tokens), range(args.batches))
            )
        elapsed = time.perf_counter() - started
        cpu_s = _cpu_s(manager.proc.pid) - cpu_started
    finally:
        manager.stop()
    latencies.sort()
    asked = (args.batches * args.prompts * args.n + args.latency_batches) * args.tokens
    return {
        "tokens_off_by": abs(asked - received - tokens),
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "tokens_per_s": tokens / elapsed,
        "cpu_us_per_token": 1e6 * cpu_s / (tokens + args.latency_batches * args.tokens),
    }


def restart(tmp: Path, engines: list[ServerProcess], samples: int, tokens: int) -> dict:
    """A manager SIGKILLed mid-batch and started again on its journal: seconds to answering and to
    the first resumed token (generated again by the engines), and whether the batch then finishes
    with every sample's tokens. `engines` stream a token every few milliseconds, so the batch is
    still running at the kill (an eighth of its tokens received)."""
    port = free_port()
    journal = tmp / "restart.db"
    manager = _start_manager(tmp, engines, journal, port)
    batch = ManagerClient(manager.url).submit([[i, 2, 3] for i in range(samples)], n=1, max_new_tokens=tokens)
    deadline = time.monotonic() + 60
    while _tokens(manager) < samples * tokens // 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    manager.kill()
    manager.stop()
    started = time.perf_counter()
    manager = _start_manager(tmp, engines, journal, port, "manager-restarted")
    answering = time.perf_counter() - started
    try:
        while _tokens(manager) == 0:
            time.sleep(0.002)
        first_token = time.perf_counter() - started
        # the same batch object: the restarted manager answers on the same port, as a trainer finds it
        lengths = [len(s["output_ids"]) for mb in batch.micro_batches() for g in mb for s in g]
    finally:
        manager.stop()
    return {
        "samples": samples,
        "tokens_per_sample": tokens,
        "answering_s": answering,
        "first_resumed_token_s": first_token,
        "samples_not_whole": samples - sum(n == tokens for n in lengths),
    }


def _tokens(manager: ServerProcess) -> int:
    status, body = http("GET", manager.url + "/workers")
    return sum(w["tokens_generated"] for w in body["workers"]) if status == 200 else 0


FULL = {
    "batches": 16,
    "prompts": 8,
    "n": 4,
    "tokens": 64,
    "latency_batches": 100,
    "repeats": 3,
    "restart_samples": 32,
    "restart_tokens": 2000,
}
QUICK = FULL | {
    "batches": 12,
    "latency_batches": 50,
    "repeats": 2,
    "restart_samples": 16,
    "restart_tokens": 800,
}
"""Inputs of a run and of a `--quick` one; an option given on the command line wins over both."""
INPUTS = {
    "batches": "batches submitted at once for throughput",
    "prompts": "prompts per throughput batch",
    "n": "samples per prompt",
    "tokens": "tokens each sample asks for",
    "latency_batches": "one-sample batches, one at a time, for latency",
    "repeats": "runs of each, alternating; medians shown",
    "restart_samples": "samples of the batch the killed manager resumes",
    "restart_tokens": "tokens each of them asks for",
}


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_inputs(parser, FULL, INPUTS)
    args = parser.parse_args()
    fill_inputs(args, FULL, QUICK)
    results = Results("manager_journal", results_dir(args))
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        runs: dict[str, list[dict]] = {"journal off": [], "journal on": []}
        engines = _start_engines(tmp, 0.0)
        try:
            for _ in range(args.repeats):  # alternating, so that load from elsewhere falls on both alike
                runs["journal off"].append(measure(args, tmp, engines, journal=False))
                runs["journal on"].append(measure(args, tmp, engines, journal=True))
        finally:
            for engine in engines:
                engine.stop()
        rows = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
        engines = _start_engines(tmp, 5.0)
        try:
            restarted = restart(tmp, engines, args.restart_samples, args.restart_tokens)
        finally:
            for engine in engines:
                engine.stop()
    print(
        f"\n{args.batches} batches x {args.prompts} prompts x n={args.n} x {args.tokens} tokens, "
        f"one token per event (medians of {args.repeats} runs each)"
    )
    columns = ["journal", "p50 ms", "p99 ms", "tokens/s", "CPU us/token"]
    print(f"{'':<14}" + "".join(f"{c:>14}" for c in columns[1:]))
    for name, row in rows.items():
        print(
            f"{name:<14}{row['p50_ms']:>14.2f}{row['p99_ms']:>14.2f}{row['tokens_per_s']:>14.0f}"
            f"{row['cpu_us_per_token']:>14.1f}"
        )
    results.table(
        f"Medians of {args.repeats} runs each, alternating",
        columns,
        [
            [
                name,
                round(r["p50_ms"], 2),
                round(r["p99_ms"], 2),
                round(r["tokens_per_s"]),
                round(r["cpu_us_per_token"], 1),
            ]
            for name, r in rows.items()
        ],
    )
    off, on = rows["journal off"], rows["journal on"]
    ratios = {
        "latency p50 on/off": on["p50_ms"] / off["p50_ms"],
        "throughput on/off": on["tokens_per_s"] / off["tokens_per_s"],
        "manager CPU per token on/off": on["cpu_us_per_token"] / off["cpu_us_per_token"],
    }
    print(
        f"\nlatency p50 on/off: {ratios['latency p50 on/off']:.3f}x (added {on['p50_ms'] - off['p50_ms']:.2f} ms)"
    )
    print(f"throughput on/off: {ratios['throughput on/off']:.3f}x (goal > {1 - MAX_COST:.2f}x)")
    print(f"manager CPU per token on/off: {ratios['manager CPU per token on/off']:.3f}x")
    print(
        f"restart after SIGKILL: answering in {restarted['answering_s']:.2f} s, first resumed token at "
        f"{restarted['first_resumed_token_s']:.2f} s, samples not whole: {restarted['samples_not_whole']}"
    )
    results.figures = {
        "settings": {k: getattr(args, k) for k in FULL},
        "medians": rows,
        "runs": runs,
        "ratios": ratios,
        "restart": restarted,
    }
    results.goal("latency p50 on/off", ratios["latency p50 on/off"], "<", 1 + MAX_COST)
    results.goal("throughput on/off", ratios["throughput on/off"], ">", 1 - MAX_COST, headline=True)
    results.goal(
        "manager CPU per token on/off",
        ratios["manager CPU per token on/off"],
        "<",
        1 + MAX_COST,
        headline=True,
    )
    lost = sum(r["tokens_off_by"] for rs in runs.values() for r in rs)
    results.goal("tokens received other than asked for, all runs", lost, "==", 0)
    results.goal(
        f"restart: samples not finished with their {args.restart_tokens} tokens after a SIGKILL mid-batch "
        f"(of {args.restart_samples})",
        restarted["samples_not_whole"],
        "==",
        0,
    )
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
