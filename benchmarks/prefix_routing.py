"""Prefix-aware routing live: GRPO groups on built-in engines with prefix caches, front by front,
beside the simulator's prediction for the same traffic on the same engines' profile.

    .venv/bin/python benchmarks/prefix_routing.py [--quick] [--groups 6] [--group-size 8] [--engines 3]
        [--output-dir outputs/bench/prefix_routing] [--results-dir benchmarks/results]

A GRPO-shaped burst: `--groups` prompts, each sent `--group-size` times at once, every prompt a
256-token system prompt shared by all followed by 768 tokens of its own, 16 tokens generated
greedily per sample, on built-in engines serving a 4-layer, 256-wide model (`rollflow engine
init-model --layers 4 --heads 4`, one torch thread each): on this CPU a 1,024-token prefill costs
about as much as the sample's 16 decode steps, so what a router saves in prefill shows in TTFT.

First it checks that a cached prefix saves the engine compute time (the same prompt cold and then
with all but its last token cached, TTFT of each), and profiles engine 0 with `rollflow profile
engine --kind builtin`. Then the burst goes through `rollflow manager` with `round_robin`, `lor`
and `prefix_affinity` (engine capacity 64, the engines' own batch limit, so the manager forwards
every sample at once as sgl-router does), and through sglang-router with `--policy cache_aware` (the
peer, pinned and installed into `.venv-sglang-router/` by `benchmarks/_peer_routers.py`), all in
front of the same engines; every configuration gets a system
prompt of its own and the engines' caches are flushed between them. Per front it prints the prefix
hit rate and the prompt tokens the engines' prefills computed (both from the engines' own
`/v1/loads` counters, not from any router's beliefs), TTFT p50/p99 (request sent to first streamed
token), samples per second over the burst and how many samples each engine prefilled (from the
same counters); beside them the simulator's prediction for the same burst (`workload.groups`,
`system_prompt_tokens`, static arrivals) on as many replicas, with the profiled tables, the
profiled round trip as `execution.request_overhead_ms`, sarathi batching with one whole prompt per
chunk and late binding at the same capacity. The simulated replicas are independent; the live
engines share this machine's cores (and its other jobs), so the live times are the longer.
`--output-dir` gets `prefix_routing.png` (hit rate, prefill tokens and TTFT p50 per front, live
beside simulated).

`--quick` sends 3 groups of 4 (the same prompts) and takes a shorter profile. Writes
`prefix_routing.json` into `--results-dir` (see benchmarks/results.py) and exits non-zero when a
goal is missed: prefix_affinity computing more than half the prompt tokens round_robin computes,
or not answering sooner (TTFT p50), a cached prefix computed again, a front that did not start,
a sample that failed or came back short, or sglang-router, the peer, not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._peer_routers import SGLANG_ROUTER
from benchmarks.results import Results, benchmark_parser, results_dir
from rollflow.perf.profile.hf_config import load_model_config, model_shape_section
from rollflow.runtime.engines.profiler.trace_replay import printed_overrides
from rollflow.runtime.launch.process import free_port
from rollflow.runtime.launch.process import rollflow_command as rollflow
from rollflow.runtime.launch.servers import (
    ENV,
    ServerProcess,
    http,
    manager_config,
    start_engine,
    start_manager,
)

REPO = Path(__file__).resolve().parents[1]

MODEL_ARGS = ("--layers", "4", "--heads", "4")
SYSTEM_TOKENS, OWN_TOKENS, NEW_TOKENS = 256, 768, 16
CAPACITY = 64  # the manager's per-engine capacity: the built-in engine's max_running_requests
ROUTERS = ("round_robin", "lor", "prefix_affinity")
PEER = "sglang-router cache_aware"
VOCAB = 500  # prompt token ids stay in 3..VOCAB+2 of the model's 512


def _prompts(run: int, groups: int, system_tokens: int, own_tokens: int) -> list[list[int]]:
    """Prompts of one configuration: its own system prompt, then each group's own tokens."""
    system = [3 + (run * 37 + i * 13) % VOCAB for i in range(system_tokens)]
    return [
        system + [3 + (run * 101 + g * 67 + i * 7) % VOCAB for i in range(own_tokens)] for g in range(groups)
    ]


def _engine_counter(engines: list[ServerProcess], key: str) -> int:
    return sum(http("GET", e.url + "/v1/loads")[1]["loads"][0][key] for e in engines)


def _prompt_tokens_seen(engines: list[ServerProcess]) -> list[float]:
    """Prompt tokens each engine's prefills have looked up in its prefix cache so far: the tokens
    it computed over the share it did not find cached (every prefill looks its prompt up once)."""
    seen = []
    for engine in engines:
        load = http("GET", engine.url + "/v1/loads")[1]["loads"][0]
        seen.append(load["prefill_tokens_computed"] / (1 - load["cache_hit_rate"]))
    return seen


def _flush(engines: list[ServerProcess]) -> None:
    for engine in engines:
        status, body = http("POST", engine.url + "/flush_cache")
        if status != 200:
            raise RuntimeError(f"{engine.url}/flush_cache: HTTP {status}: {body}")


def _timed_generate(url: str, prompt: list[int]) -> float:
    """Seconds for one request of one new token (its prefill and a round trip)."""
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    started = time.perf_counter()
    status, output = http("POST", url + "/generate", body)
    if status != 200:
        raise RuntimeError(f"{url}/generate: HTTP {status}: {output}")
    return time.perf_counter() - started


def check_cached_prefill(engine: ServerProcess, prompt_tokens: int, repeats: int = 3) -> dict[str, float]:
    """TTFT of a prompt computed whole, then of the same prompt again (all but its last token
    cached), median of `repeats` fresh prompts; the engine's own count of the tokens each computed."""
    cold, cached, computed = [], [], []
    for r in range(repeats):
        prompt = [3 + (9000 + r * 4099 + i * 11) % VOCAB for i in range(prompt_tokens)]
        before = _engine_counter([engine], "prefill_tokens_computed")
        cold.append(_timed_generate(engine.url, prompt))
        middle = _engine_counter([engine], "prefill_tokens_computed")
        cached.append(_timed_generate(engine.url, prompt))
        computed.append((middle - before, _engine_counter([engine], "prefill_tokens_computed") - middle))
    _flush([engine])
    return {
        "prompt_tokens": prompt_tokens,
        "cold_ms": 1000 * statistics.median(cold),
        "cached_ms": 1000 * statistics.median(cached),
        "cold_computed": computed[0][0],
        "cached_computed": computed[0][1],
    }


def profile(engine: ServerProcess, model: Path, out: Path, quick: bool) -> float:
    """Profile the engine into Vidur-format tables under `out`; the request round trip in ms."""
    lengths = "1,256,1024" if quick else "1,64,256,512,1024"
    argv = rollflow(
        "profile", "engine", "--url", engine.url, "--kind", "builtin",
        "--model-config", str(model / "config.json"), "--out", str(out),
        "--batch-sizes", "1,4,16" if quick else "1,4,8,16", "--prompt-lengths", lengths,
        "--decode-tokens", "16", "--repeats", "1" if quick else "2",
    )  # fmt: skip
    printed = subprocess.run(argv, env=ENV, check=True, capture_output=True, text=True).stdout
    return printed_overrides(printed)["request_overhead_ms"]


async def _burst(url: str, prompts: list[list[int]], group_size: int) -> tuple[list[float], float, list[str]]:
    """Send every sample at once, streamed; (TTFT of each, seconds for the whole burst, what failed:
    an error status, a broken stream, or one short of its NEW_TOKENS tokens)."""
    failures: list[str] = []

    async def one(session: aiohttp.ClientSession, prompt: list[int]) -> float | None:
        body = {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
            "stream": True,
        }
        started = time.perf_counter()
        ttft, completion = None, 0
        try:
            async with session.post(url + "/generate", json=body) as response:
                if response.status != 200:
                    failures.append(f"{url}: HTTP {response.status}: {(await response.text())[:200]}")
                    return None
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    event = json.loads(line[6:])
                    if ttft is None and event.get("output_ids"):
                        ttft = time.perf_counter() - started
                    completion = event.get("meta_info", {}).get("completion_tokens", completion)
        except (TimeoutError, aiohttp.ClientError) as exc:
            failures.append(f"{url}: {exc!r}")
            return None
        if ttft is None or completion != NEW_TOKENS:
            failures.append(f"{url}: a stream ended after {completion} of {NEW_TOKENS} tokens")
            return None
        return ttft

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        started = time.perf_counter()
        ttfts = await asyncio.gather(*(one(session, prompt) for prompt in prompts for _ in range(group_size)))
        elapsed = time.perf_counter() - started
    return [t for t in ttfts if t is not None], elapsed, failures


def _start_manager(router: str, engines: list[ServerProcess], tmp: Path) -> ServerProcess:
    config = manager_config([e.url for e in engines], CAPACITY, "builtin", router=router)
    return start_manager(config, tmp, name=f"manager-{router}")


def _start_sglang_router(interpreter: Path, engines: list[ServerProcess], tmp: Path) -> ServerProcess:
    port = free_port()
    urls = [e.url for e in engines]
    argv = SGLANG_ROUTER.argv(interpreter, urls, port, free_port(), "--policy", "cache_aware")
    process = ServerProcess(argv, port, tmp / "sglang-router.log", wait=False)
    deadline = time.monotonic() + 120
    while True:  # the router registers its workers in the background once it listens
        try:
            workers = http("GET", process.url + "/workers", timeout=2)[1]["workers"]
            if len(workers) == len(engines) and all(w["is_healthy"] for w in workers):
                return process
        except (OSError, KeyError, TypeError):
            pass
        if process.proc.poll() is not None or time.monotonic() > deadline:
            process.stop()
            raise RuntimeError(f"sglang-router did not register its workers:\n{process.log()}")
        time.sleep(0.2)


def run_live(
    front: ServerProcess, engines: list[ServerProcess], prompts: list[list[int]], group_size: int
) -> dict:
    """One burst through `front`; hit rate and prefill tokens from the engines' own counters."""
    computed_before = _engine_counter(engines, "prefill_tokens_computed")
    seen_before = _prompt_tokens_seen(engines)
    ttfts, elapsed, failures = asyncio.run(_burst(front.url, prompts, group_size))
    computed = _engine_counter(engines, "prefill_tokens_computed") - computed_before
    seen = [after - before for after, before in zip(_prompt_tokens_seen(engines), seen_before, strict=True)]
    prompt_tokens = group_size * sum(len(p) for p in prompts)
    return {
        "hit_rate": 1 - computed / prompt_tokens,
        "prefill_tokens": computed,
        "samples_per_engine": [round(tokens / len(prompts[0])) for tokens in seen],
        "ttft_p50_ms": 1000 * float(np.percentile(ttfts, 50)) if ttfts else None,
        "ttft_p99_ms": 1000 * float(np.percentile(ttfts, 99)) if ttfts else None,
        "samples_per_s": len(ttfts) / elapsed,
        "failed": len(failures),
        "failures": failures[:5],
    }


def simulate(router: str, args: argparse.Namespace, model: Path, tables: Path, round_trip_ms: float) -> dict:
    """The simulator's figures for the same burst on `args.engines` replicas of the profiled engine."""
    from rollflow.config import validate_config
    from rollflow.sim.config import SimConfig
    from rollflow.sim.metrics import request_table, summarize
    from rollflow.sim.simulator import ServingSimulator
    from rollflow.sim.workload import build_requests

    prompt_tokens = args.system_tokens + args.own_tokens
    raw = {
        "cluster": {
            "replicas": args.engines,
            "model": "builtin-engine",
            "model_shape": model_shape_section(load_model_config(model)),
            "router": router,
            "dispatch": "late_binding",
            "capacity": CAPACITY,
        },
        # the built-in engine prefills a whole prompt in one step, one request after another: an
        # iteration's chunk holds one whole uncached prompt (or several mostly cached ones)
        "scheduler": {
            "kind": "sarathi",
            "chunk_size": prompt_tokens,
            "batch_size_cap": 64,
            "prefix_caching": True,
        },
        "execution": {
            "kind": "tables",
            "compute_table": str(tables / "mlp.csv"),
            "attention_table": str(tables / "attention.csv"),
            "max_batch_size": 64,
            "request_overhead_ms": round_trip_ms,
        },
        "workload": {
            "kind": "synthetic",
            "num_requests": args.groups,
            "max_tokens": prompt_tokens + NEW_TOKENS,
            "system_prompt_tokens": args.system_tokens,
            "groups": {"size": args.group_size},
            "lengths": {"kind": "fixed", "prefill_tokens": args.own_tokens, "decode_tokens": NEW_TOKENS},
            "intervals": {"kind": "static"},
        },
        "output": {"plots": False, "chrome_trace": False, "progress": False},
    }
    config = validate_config(SimConfig, raw)
    result = ServingSimulator(config, build_requests(config.workload, config.seed)).run()
    table = request_table(result)
    summary = summarize(result, table, 0.0)
    ttfts = table.columns["ttft"]
    return {
        "hit_rate": summary["prefix_hit_rate"],
        "prefill_tokens": summary["prefill_tokens_computed"],
        "ttft_p50_ms": 1000 * float(np.percentile(ttfts, 50)),
        "ttft_p99_ms": 1000 * float(np.percentile(ttfts, 99)),
        "samples_per_s": len(ttfts) / float(table.columns["completed_at"].max()),
    }


def plot(results: dict, path: Path) -> Path:
    """Hit rate, prefill tokens and TTFT p50 per front, live beside simulated (Agg, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fronts = list(results["live"])
    panels = (
        ("hit_rate", "prefix hit rate"),
        ("prefill_tokens", "prompt tokens computed"),
        ("ttft_p50_ms", "TTFT p50 (ms)"),
    )
    fig = Figure(figsize=(13, 3.8))
    axes = fig.subplots(1, len(panels))
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.17, top=0.86, wspace=0.25)
    x = np.arange(len(fronts))
    for ax, (key, label) in zip(axes, panels, strict=True):
        live = [_number(results["live"][f].get(key)) for f in fronts]
        sim = [_number(results["simulated"].get(f.removeprefix("manager "), {}).get(key)) for f in fronts]
        ax.bar(x - 0.2, live, width=0.4, label="live", color="tab:blue")
        ax.bar(x + 0.2, sim, width=0.4, label="simulated", color="tab:orange")
        ax.set_xticks(x, [f.replace(" ", "\n", 1) for f in fronts], fontsize=8)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    setup = results["setup"]
    fig.suptitle(
        f"GRPO burst: {setup['groups']} prompts x {setup['group_size']} samples, "
        f"{setup['system_tokens']} shared + {setup['own_tokens']} own prompt tokens, "
        f"{setup['engines']} built-in engines (load average {setup['load_average']:.1f})"
    )
    FigureCanvasAgg(fig)  # the canvas attaches itself to the figure
    fig.savefig(path, dpi=100)
    return path


def _number(value: float | None) -> float:
    return np.nan if value is None else value


def _print(results: dict) -> None:
    setup, check = results["setup"], results["prefill_check"]
    print(
        f"\nprefill check on one engine: {check['prompt_tokens']} tokens cold {check['cold_ms']:.0f} ms "
        f"({check['cold_computed']} computed), again with its prefix cached {check['cached_ms']:.0f} ms "
        f"({check['cached_computed']} computed): {check['cold_ms'] / check['cached_ms']:.1f}x"
    )
    print(
        f"{setup['groups']} groups x {setup['group_size']} samples, prompts of {setup['system_tokens']} shared + "
        f"{setup['own_tokens']} own tokens, {NEW_TOKENS} generated, {setup['engines']} built-in engines; "
        f"load average {setup['load_average']:.1f} on {os.cpu_count()} CPUs (one run)"
    )
    print(
        "| front | hit rate | prefill tokens | TTFT p50 / p99 ms | samples/s "
        "| samples per engine | sim hit rate | sim prefill tokens | sim TTFT p50 / p99 ms | sim samples/s |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for front, live in results["live"].items():
        sim = results["simulated"].get(front.removeprefix("manager "))
        cells = (
            [f"failed: {live.get('error') or live['failures']}", "", "", "", ""]
            if "error" in live or live["failed"]
            else [
                f"{live['hit_rate']:.3f}",
                f"{live['prefill_tokens']:,}",
                f"{live['ttft_p50_ms']:.0f} / {live['ttft_p99_ms']:.0f}",
                f"{live['samples_per_s']:.1f}",
                " ".join(map(str, live["samples_per_engine"])),
            ]
        )
        cells += (
            ["", "", "", ""]
            if sim is None
            else [
                f"{sim['hit_rate']:.3f}",
                f"{sim['prefill_tokens']:,}",
                f"{sim['ttft_p50_ms']:.0f} / {sim['ttft_p99_ms']:.0f}",
                f"{sim['samples_per_s']:.1f}",
            ]
        )
        print(f"| {front} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--groups", type=int, help="prompts in the burst (6; --quick: 3)")
    parser.add_argument("--group-size", type=int, help="samples per prompt (8; --quick: 4)")
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--output-dir", type=Path, default=REPO / "outputs" / "bench" / "prefix_routing")
    args = parser.parse_args()
    args.groups = args.groups or (3 if args.quick else 6)
    args.group_size = args.group_size or (4 if args.quick else 8)
    # the same prompts in --quick: on shorter ones prefill is too small a share of TTFT to show
    args.system_tokens, args.own_tokens = SYSTEM_TOKENS, OWN_TOKENS
    record = Results("prefix_routing", results_dir(args))
    interpreter = SGLANG_ROUTER.python()
    record.peers["sglang-router"] = SGLANG_ROUTER.installed_version(interpreter)
    results: dict = {"live": {}, "simulated": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = tmp / "model"
        subprocess.run(
            rollflow("engine", "init-model", str(model), *MODEL_ARGS),
            env=ENV,
            check=True,
            capture_output=True,
        )
        engine_args = ("--threads", "1")
        engines = [
            start_engine(model, tmp, name=f"engine{i}", wait=False, extra_args=engine_args)
            for i in range(args.engines)
        ]
        try:
            for engine in engines:
                engine.wait_ready()
            prompt_tokens = args.system_tokens + args.own_tokens
            results["prefill_check"] = check_cached_prefill(engines[0], prompt_tokens)
            round_trip_ms = profile(engines[0], model, tmp / "tables", args.quick)
            _flush(engines)
            configs = [(f"manager {r}", lambda r=r: _start_manager(r, engines, tmp)) for r in ROUTERS]
            configs.append((PEER, lambda: _start_sglang_router(interpreter, engines, tmp)))
            loads = []
            for run, (name, start) in enumerate(configs):
                prompts = _prompts(run, args.groups, args.system_tokens, args.own_tokens)
                try:
                    front = start()
                    try:
                        loads.append(os.getloadavg()[0])
                        results["live"][name] = run_live(front, engines, prompts, args.group_size)
                    finally:
                        front.stop()
                except RuntimeError as exc:  # the front did not start
                    results["live"][name] = {"error": str(exc)[:300]}
                _flush(engines)
            for router in ROUTERS:
                results["simulated"][router] = simulate(router, args, model, tmp / "tables", round_trip_ms)
        finally:
            for engine in engines:
                engine.stop()
    results["setup"] = {
        "groups": args.groups,
        "group_size": args.group_size,
        "engines": args.engines,
        "system_tokens": args.system_tokens,
        "own_tokens": args.own_tokens,
        "new_tokens": NEW_TOKENS,
        "round_trip_ms": round_trip_ms,
        "load_average": statistics.mean(loads),
    }
    _print(results)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = plot(results, args.output_dir / "prefix_routing.png")
    print(f"\nwrote {path}")
    _judge(results, record)
    sys.exit(record.finish())


def _judge(results: dict, record: Results) -> None:
    """The figures, a table per front, and the goals: the docs' claims (prefix_affinity computes at
    most half the prompt tokens round_robin does, and answers sooner; a cached prefix is not
    computed again) and a valid run (every front started, every sample whole)."""
    record.figures = results
    live, simulated = results["live"], results["simulated"]
    columns = ["front", "hit rate", "prompt tokens computed", "TTFT p50 ms", "TTFT p99 ms", "samples/s"]
    columns += ["samples per engine", "simulated hit rate", "simulated tokens", "simulated TTFT p50 ms"]
    rows = []
    for front, m in live.items():
        sim = simulated.get(front.removeprefix("manager "), {})
        cells = [
            m.get(k) for k in ("hit_rate", "prefill_tokens", "ttft_p50_ms", "ttft_p99_ms", "samples_per_s")
        ]
        rows.append(
            [front, *(_rounded(c) for c in cells), " ".join(map(str, m.get("samples_per_engine", [])))]
            + [_rounded(sim.get(k)) for k in ("hit_rate", "prefill_tokens", "ttft_p50_ms")]
        )
    setup = results["setup"]
    record.table(
        f"GRPO burst: {setup['groups']} prompts x {setup['group_size']} samples on {setup['engines']} engines",
        columns,
        rows,
    )
    failed = sum(m.get("failed", 0) for m in live.values()) + sum("error" in m for m in live.values())
    record.goal("fronts that did not start, and samples failed or short, every front", failed, "==", 0)
    check = results["prefill_check"]
    record.goal(
        "prefill check: prompt tokens computed again with the prefix cached",
        check["cached_computed"],
        "==",
        1,
    )
    ours = live.get("manager prefix_affinity", {})
    base = live.get("manager round_robin", {})
    for claim, key, op, bound in (
        ("prompt tokens computed", "prefill_tokens", "<=", 0.5),
        ("TTFT p50", "ttft_p50_ms", "<", 1.0),
    ):
        ratio = _ratio(ours.get(key), base.get(key))
        record.goal(f"{claim}, prefix_affinity / round_robin", ratio, op, bound, headline=True)
    peer = live.get(PEER, {})
    record.figures["prefix_affinity_over_cache_aware"] = {
        key: _ratio(ours.get(key), peer.get(key))
        for key in ("prefill_tokens", "ttft_p50_ms", "samples_per_s")
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _rounded(value: float | None) -> float | None:
    return round(value, 3) if isinstance(value, float) else value


if __name__ == "__main__":
    main()
