"""Vidur's config explorer against `rollflow sim search` on one small space, side by side.

    .venv/bin/python benchmarks/search_vs_vidur.py
    .venv/bin/python benchmarks/search_vs_vidur.py --quick    # Sarathi/512 only, 300 requests per simulation, speed goal 10x

Vidur runs at a pinned commit from its own checkout and virtual environment, both set up by the
benchmark (benchmarks/vidur_peer.py). The space is Vidur's search format: Llama-2-7B on 2 A100s
with Vidur's tables (MLP and network from ../shared/data/vidur, attention from
../shared/tools/attention_table.py), tensor parallel 1 (2 replicas) or 2 (1 replica), vLLM or
Sarathi with chunk 512 or 1024, batch cap 128; requests with the Splitwise conversation trace's
lengths arriving as a Poisson process; SLO: scheduling delay P99 <= 5 s (Vidur's default metric).
Goals: every configuration's max QPS within 5% of Vidur's, the same best configuration by QPS per
dollar, and rollflow's search at least 20x faster (both whole processes, one run each).

Vidur's side is its own `CapacitySearch` (`vidur/config_optimizer/config_explorer`): its
bisection, its `python -m vidur.main` runs and its result files, one configuration per process
in a pool of `--workers`, from an empty output folder (its search answers a rate it finds a
result file for from that file, without simulating). Its Ray runner is not used: it reserves
`os.cpu_count() - 2` cores per node for searches, none on a 2-core machine, and would wait
forever. Its simulations get vidur_compare.py's one-setting random-forest flags unless
`--vidur-full-training`. Two words of its run commands are dropped: `nice -n 1` (rollflow's side
runs at normal priority) and `--synthetic_request_generator_config_max_tokens` with its value,
which `vidur.main` at the same commit no longer accepts, so every run failed. Vidur's predictors
are trained before the timed search, once per tensor-parallel size, by its own run command on
50 requests; the warm-up is recorded, and a timed search that still trained one fails the run.
rollflow's side runs `rollflow sim search` through its CLI, once per (tensor parallel, replicas)
pair, from scratch (`--resume never`), after a warm-up search that fills its operator-grid cache.

Both see the same requests: rollflow's workload takes `rng: vidur` (Vidur's own random streams
for seed 42: gaps from Python's `random`, the trace shuffled by numpy's legacy RandomState) and
`max_gap_factor: 3` (Vidur's Poisson generator clips every gap at 3 mean gaps, so its requests
arrive about 5% faster than the QPS it is given), so at every rate both simulate one list. After
the searches, every rate Vidur probed is simulated again by rollflow on the same requests, and the
scheduling delay P99 of both is tabled with their pass/fail verdicts: that separates the
simulators from the bisections. The bisections differ (Vidur's starts from 0..2 x start_qps and
widens by 2x or 4x when the delay is far under the SLO; rollflow doubles from start_qps, see
rollflow/plan/bisect.py), each stopping within 2.5%. `--seeds` adds rollflow searches with its own
sampler (numpy, exact Poisson) for those seeds, to show how far sampling alone moves a max QPS.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, add_inputs, benchmark_parser, fill_inputs, results_dir
from vidur_compare import MODEL, QUICK_TRAINING, add_folder_options, cached_predictors, prepare_workdir
from vidur_peer import Vidur, add_vidur_options, ensure_vidur, venv_versions

REPO = Path(__file__).resolve().parents[1]
NUM_GPUS = 2
LAYOUTS = [(1, 2), (2, 1)]  # (tensor parallel, replicas) on NUM_GPUS GPUs, as Vidur's explorer derives them
SCHEDULERS = [("vllm", None), ("sarathi", 512), ("sarathi", 1024)]
QUICK_SCHEDULERS = [("sarathi", 512)]
FULL = {"num_requests": 1000}
QUICK = {"num_requests": 300}
"""Inputs of a run and of a `--quick` one; an option given on the command line wins over both."""
BATCH_SIZE_CAP = 128
SLO_S = 5.0
START_QPS = 2.0
GRANULARITY_PCT = 2.5
PRICE_PER_GPU_HOUR = 2.0  # a100; only ratios matter for the pick
WARMUP_REQUESTS = 50
# docs/guides/capacity-planning.md's goals
MAX_QPS_DIFF_PCT = 5.0
MIN_SPEEDUP = 20.0
# --quick's search (300 requests, one scheduler) is mostly each side's start-up, which rollflow's
# 20x is not about: a smaller goal of its own, named as the quick one, so that a quick run still
# fails on a real slow-down without claiming the full search's figure.
QUICK_MIN_SPEEDUP = 10.0
# Words the explorer (at the pinned commit) writes into its run commands that the benchmark drops:
# `nice -n 1` (rollflow's side is not niced) and a flag `vidur.main` no longer accepts, with its
# value (every run would fail with "unrecognized arguments"; no effect on a trace-length workload).
NICE = ["nice", "-n", "1"]
STALE_EXPLORER_FLAGS = ["--synthetic_request_generator_config_max_tokens"]
VIDUR_SEED = 42  # Vidur's default request-generator seed, which its explorer keeps
VIDUR_MAX_GAP_FACTOR = 3.0  # its Poisson generator clips every gap at 3 mean gaps

# Vidur's CapacitySearch per configuration in a process pool ("search"), or its run command once per
# tensor-parallel size ("warmup"); writes what it did to spec["out"].
VIDUR_DRIVER = """
import argparse, json, multiprocessing, shlex, subprocess, sys, time
from vidur.config_optimizer.config_explorer.capacity_search import CapacitySearch
from vidur.config_optimizer.config_explorer.config import JobConfig, SimulationConfig

spec = json.loads(sys.argv[1])

class Search(CapacitySearch):
    def _generate_run_command(self, scheduler_config):
        words = super()._generate_run_command(scheduler_config).split()
        if words[:len(spec["nice"])] == spec["nice"]:
            del words[:len(spec["nice"])]
        for flag in spec["drop_flags"]:  # with its value
            if flag in words:
                index = words.index(flag)
                del words[index:index + 2]
        return " ".join(words + spec["extra_flags"])

def search(job):
    start = time.perf_counter()
    result = Search(job, argparse.Namespace(**spec["args"])).search()
    return {**result, "seconds": time.perf_counter() - start}

def warm_up():
    args, seconds = argparse.Namespace(**spec["args"]), {}
    for job in JobConfig.generate_job_configs(spec["explorer"]):
        tp = job.num_tensor_parallel_workers
        if tp in seconds:
            continue
        config = SimulationConfig(args.output_dir, args.cache_dir, spec["warmup_qps"], args.time_limit, job)
        start = time.perf_counter()
        subprocess.run(shlex.split(Search(job, args)._generate_run_command(config)), check=True,
                       stdout=subprocess.DEVNULL)
        seconds[tp] = time.perf_counter() - start
    return seconds

if __name__ == "__main__":
    if spec["mode"] == "warmup":
        json.dump({"seconds": warm_up()}, open(spec["out"], "w"))
    else:
        jobs = JobConfig.generate_job_configs(spec["explorer"])
        with multiprocessing.Pool(spec["workers"]) as pool:
            results = pool.map(search, jobs, chunksize=1)
        json.dump({"results": results}, open(spec["out"], "w"))
"""


def explorer_config(trace: Path, num_requests: int, schedulers: list[tuple[str, int | None]]) -> dict:
    """The space in the format of Vidur's config explorer (its `--config-path` YAML)."""
    return {
        "models": [{"name": "llama-2-7b", "identifier": MODEL}],
        "traces": [
            {
                "name": "conv",
                "trace_file": str(trace),
                "max_seq_len": 4096,
                "num_requests": num_requests,
                "start_qps": START_QPS,
            },
        ],
        "clusters": [{"device": "a100", "num_gpus": NUM_GPUS, "gpus_per_node": NUM_GPUS}],
        "schedulers": [
            {"scheduler": kind, **({"chunk_size": chunk} if chunk else {})} for kind, chunk in schedulers
        ],
        "tp_dimensions": [tp for tp, _ in LAYOUTS],
        "pp_dimensions": [1],
        "batch_sizes": [BATCH_SIZE_CAP],
    }


def run_vidur(
    vidur: Vidur, mode: str, workdir: Path, trace: Path, num_requests: int, args: argparse.Namespace
) -> tuple[float, dict]:
    """One process of VIDUR_DRIVER from an empty output folder: its wall time and what it wrote."""
    output = workdir / f"vidur-{mode}"
    shutil.rmtree(output, ignore_errors=True)  # its search would answer from old result files
    out = workdir / f"vidur-{mode}.json"
    spec = {
        "mode": mode,
        "explorer": explorer_config(trace, num_requests, args.schedulers),
        "args": {
            "output_dir": str(output),
            "cache_dir": str(workdir / "cache"),
            "time_limit": 30,  # minutes of simulated time, Vidur's default
            "scheduling_delay_slo_value": SLO_S,
            "scheduling_delay_slo_quantile": 0.99,
            "max_iterations": 20,
            "min_search_granularity": GRANULARITY_PCT,
        },
        "extra_flags": [] if args.vidur_full_training else QUICK_TRAINING,
        "nice": NICE,
        "drop_flags": STALE_EXPLORER_FLAGS,
        "warmup_qps": START_QPS,
        "workers": args.workers,
        "out": str(out),
    }
    start = time.perf_counter()
    with (workdir / f"vidur-{mode}.log").open("w") as log:
        proc = subprocess.run(
            [str(vidur.python), "-c", VIDUR_DRIVER, json.dumps(spec)],
            cwd=workdir, env=vidur.env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    if proc.returncode:
        sys.exit(f"Vidur's {mode} failed: see {workdir / f'vidur-{mode}.log'}")
    return time.perf_counter() - start, json.loads(out.read_text())


def rollflow_config(
    workdir: Path,
    trace: Path,
    num_requests: int,
    tp: int,
    replicas: int,
    workers: int,
    seed: int | None,
    schedulers: list[tuple[str, int | None]],
) -> dict:
    """The search in rollflow's format; seed None: Vidur's requests (seed 42, Vidur's draws)."""
    tables = workdir / "data" / "profiling"
    vidurs = seed is None
    return {
        "simulation": {
            "seed": VIDUR_SEED if vidurs else seed,
            "cluster": {"model": MODEL, "device": "a100", "network_device": "a100_pairwise_nvlink"},
            "scheduler": {"max_tokens_in_batch": 4096},
            "execution": {
                "kind": "tables",
                "compute_table": f"{tables}/compute/{{DEVICE}}/{{MODEL}}/mlp.csv",
                "attention_table": f"{tables}/compute/{{DEVICE}}/{{MODEL}}/attention.csv",
                "all_reduce_table": f"{tables}/network/{{NETWORK_DEVICE}}/all_reduce.csv",
                "send_recv_table": f"{tables}/network/{{NETWORK_DEVICE}}/send_recv.csv",
            },
            "workload": {
                "kind": "synthetic",
                "num_requests": num_requests,
                "max_tokens": 4096,
                "lengths": {"kind": "trace", "file": str(trace)},
                "intervals": {
                    "kind": "poisson",
                    **({"max_gap_factor": VIDUR_MAX_GAP_FACTOR} if vidurs else {}),
                },
                "rng": "vidur" if vidurs else "numpy",
            },
            "simulator": {"time_limit_s": 1800.0},
        },
        "slos": [{"metric": "scheduling_delay", "quantile": 99, "max_s": SLO_S}],
        "prices": {"a100": PRICE_PER_GPU_HOUR},
        "space": {
            "device": ["a100"],
            "tensor_parallel": [tp],
            "replicas": [replicas],
            "scheduler": sorted({kind for kind, _ in schedulers}),
            "chunk_size": sorted({chunk for _, chunk in schedulers if chunk}),
            "batch_size_cap": [BATCH_SIZE_CAP],
        },
        "bisection": {"start_qps": START_QPS, "tolerance": GRANULARITY_PCT / 100},
        "workers": workers,
    }


def run_rollflow(
    args: argparse.Namespace, workdir: Path, trace: Path, seed: int | None, num_requests: int, tag: str = ""
) -> tuple[float, list[dict]]:
    """One whole search (every layout, one process each): its wall time and rows. Seed None:
    Vidur's requests."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows: list[dict] = []
    wall = 0.0
    for tp, replicas in LAYOUTS:
        name = f"rollflow-search-{'vidur-requests' if seed is None else f'seed{seed}'}{tag}-tp{tp}"
        config = workdir / f"{name}.yaml"
        raw = rollflow_config(workdir, trace, num_requests, tp, replicas, args.workers, seed, args.schedulers)
        config.write_text(yaml.safe_dump(raw))
        out = workdir / name
        start = time.perf_counter()
        with (workdir / f"{name}.log").open("w") as log:
            subprocess.run(
                [sys.executable, "-m", "rollflow.cli", "sim", "search", "--config", str(config),
                 "--output-dir", str(out), "--resume", "never"],
                cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, check=True,
            )  # fmt: skip
        wall += time.perf_counter() - start
        rows += json.loads((out / "results.json").read_text())
    return wall, rows


def key(tp: int, scheduler: str, chunk: int | None) -> str:
    return f"TP{tp} x{NUM_GPUS // tp}, {scheduler}" + (f"/{chunk}" if scheduler == "sarathi" else "")


def vidur_rows(results: list[dict]) -> dict[str, tuple[float | None, float]]:
    table = {}
    for row in results:
        tp = row["replica_config_tensor_parallel_size"]
        kind = row["replica_scheduler_config_type"]
        chunk = row.get("sarathi_scheduler_config_chunk_size")
        table[key(tp, kind, chunk)] = (row["max_qps_under_sla"], row["seconds"])
    return table


def rollflow_rows(rows: list[dict]) -> dict[str, tuple[float | None, float]]:
    table = {}
    for row in rows:
        if row.get("skipped"):
            continue
        chunk = row.get("chunk_size")
        table[key(row["tensor_parallel"], row["scheduler"], chunk)] = (row["max_qps"], row["seconds"])
    return table


def vidur_probes(workdir: Path) -> list[tuple[str, float, float]]:
    """Every rate Vidur's searches simulated: (configuration, QPS, its scheduling delay P99).

    The P99 is what `CapacitySearch._is_under_sla` computes: pandas' linear quantile over every
    request in its run's plots/request_scheduling_delay.csv (every completed request).
    """
    probes = []
    for result in sorted(
        (workdir / "vidur-search" / "runs").glob("*/*/*/plots/request_scheduling_delay.csv")
    ):
        run = result.parents[1]
        config = json.loads((run / "config.json").read_text())["cluster_config"]
        scheduler = config["replica_scheduler_config"]
        name = key(
            config["replica_config"]["tensor_parallel_size"], scheduler["name"], scheduler.get("chunk_size")
        )
        delays = np.loadtxt(result, delimiter=",", skiprows=1, usecols=2, ndmin=1)
        probes.append((name, float(run.parent.name), float(np.percentile(delays, 99))))
    return sorted(probes)


def rollflow_p99(workdir: Path, trace: Path, args: argparse.Namespace, name: str, qps: float) -> float:
    """rollflow's scheduling delay P99 for configuration `name` at `qps`, on Vidur's requests."""
    from rollflow.config import validate_config
    from rollflow.plan.space import apply_knobs
    from rollflow.sim.config import SimConfig
    from rollflow.sim.runner import run_simulation

    tp = int(name[2])
    kind, _, chunk = name.split(", ")[1].partition("/")
    raw = rollflow_config(workdir, trace, args.num_requests, tp, NUM_GPUS // tp, 1, None, args.schedulers)
    knobs = {"device": "a100", "tensor_parallel": tp, "pipeline_stages": 1, "replicas": NUM_GPUS // tp,
             "router": "round_robin", "scheduler": kind, "batch_size_cap": BATCH_SIZE_CAP,
             "chunk_size": int(chunk) if chunk else None}  # fmt: skip
    sim = apply_knobs(raw["simulation"], knobs, qps)
    sim["output"] = {"dir": str(workdir / "rollflow-probe"), "plots": False, "chrome_trace": False,
                     "requests_csv": False, "progress": False}  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        summary = run_simulation(validate_config(SimConfig, sim))
    return float(summary["scheduling_delay"]["p99"])


def probe_table(results: Results, workdir: Path, trace: Path, args: argparse.Namespace) -> None:
    """Vidur's P99 at every rate it probed beside rollflow's on the same requests, and verdicts."""
    rows, agree, diffs = [], 0, []
    probes = vidur_probes(workdir)
    for name, qps, theirs in probes:
        mine = rollflow_p99(workdir, trace, args, name, qps)
        same = (mine <= SLO_S) == (theirs <= SLO_S)
        agree += same
        if theirs > 0:
            diffs.append(100 * (mine - theirs) / theirs)
        verdict = ("both pass" if mine <= SLO_S else "both fail") if same else "differ"
        diff = f"{diffs[-1]:+.1f}%" if theirs > 0 else ""
        rows.append([name, round(qps, 4), round(theirs, 3), round(mine, 3), diff, verdict])
    results.table(
        f"Scheduling delay P99 (s) at every rate Vidur probed, same requests (SLO {SLO_S:g} s)",
        ["configuration", "QPS", "Vidur P99", "rollflow P99", "diff", "verdicts"],
        rows,
    )
    results.figures["probes"] = len(probes)
    results.figures["probe_verdicts_agree"] = agree
    if diffs:
        results.figures["probe_p99_diff_pct"] = {
            "median": float(np.median(diffs)),
            "min": min(diffs),
            "max": max(diffs),
        }


def best(table: dict[str, tuple[float | None, float]]) -> str | None:
    """Capacity per dollar: every configuration uses NUM_GPUS GPUs at one price, so the highest QPS."""
    found = [k for k, (qps, _) in table.items() if qps]
    return max(found, key=lambda k: table[k][0]) if found else None


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_vidur_options(parser)
    add_inputs(parser, FULL, {"num_requests": "requests per simulation, both sides"})
    parser.add_argument("--workers", type=int, default=2, help="configurations searched at once (both sides)")
    add_folder_options(parser)
    parser.add_argument(
        "--seeds",
        default="",
        help="also search with rollflow's own sampler (numpy, exact Poisson) at these comma-separated "
        "seeds, for each configuration's range of max QPS under sampling noise (default: none)",
    )
    args = parser.parse_args()
    fill_inputs(args, FULL, QUICK)
    args.schedulers = QUICK_SCHEDULERS if args.quick else SCHEDULERS
    results = Results("search_vs_vidur", results_dir(args))
    vidur = ensure_vidur(args.vidur_src)
    results.peers["vidur"] = vidur.commit
    results.figures["vidur_packages"] = venv_versions(vidur)
    results.figures["num_requests"] = args.num_requests
    workdir, shared = prepare_workdir(args)
    trace = shared / "data" / "vidur" / "processed_traces" / "splitwise_conv.csv"
    seeds = [int(s) for s in args.seeds.split(",") if s]

    print(f"warming Vidur's predictors for tensor parallel {[tp for tp, _ in LAYOUTS]} ...", flush=True)
    before = cached_predictors(workdir)
    _, warm = run_vidur(vidur, "warmup", workdir, trace, WARMUP_REQUESTS, args)
    results.figures["vidur_warmup"] = {
        "tensor_parallel_seconds": warm["seconds"],
        "requests": WARMUP_REQUESTS,
        "trained": cached_predictors(workdir) > before,
    }
    run_rollflow(args, workdir, trace, None, WARMUP_REQUESTS, "-warmup")  # rollflow's operator grids

    configurations = len(LAYOUTS) * len(args.schedulers)
    print(f"Vidur's capacity search: {configurations} configurations ...", flush=True)
    before = cached_predictors(workdir)
    vidur_wall, searched = run_vidur(vidur, "search", workdir, trace, args.num_requests, args)
    trained = cached_predictors(workdir) - before
    theirs = vidur_rows(searched["results"])
    print("rollflow sim search on Vidur's requests ...", flush=True)
    wall, rows = run_rollflow(args, workdir, trace, None, args.num_requests)
    ours = rollflow_rows(rows)
    by_seed = []
    for seed in seeds:
        print(f"rollflow sim search, own sampler, seed {seed} ...", flush=True)
        by_seed.append(rollflow_rows(run_rollflow(args, workdir, trace, seed, args.num_requests)[1]))

    table, diffs = [], []
    for name in sorted(set(ours) | set(theirs)):
        mine, mine_s = ours.get(name, (None, float("nan")))
        other, other_s = theirs.get(name, (None, float("nan")))
        diff = 100 * (mine - other) / other if mine and other else None
        diffs.append(abs(diff) if diff is not None else None)
        row = [name, other, mine, f"{diff:+.1f}%" if diff is not None else "-"]
        if seeds:
            values = [t.get(name, (None,))[0] or 0.0 for t in by_seed]
            row.append(f"{min(values):.2f}-{max(values):.2f}")
        table.append([*row, round(other_s, 1), round(mine_s, 1)])
    seed_column = [f"rollflow's sampler, seeds {args.seeds}: min-max"] if seeds else []
    results.table(
        f"Max QPS with scheduling delay P99 <= {SLO_S:g} s ({args.num_requests} requests per simulation)",
        ["configuration", "Vidur", "rollflow, same requests", "diff", *seed_column, "Vidur s", "rollflow s"],
        table,
    )
    results.figures.update(
        {
            "vidur_wall_s": vidur_wall,
            "rollflow_wall_s": wall,
            "best_vidur": best(theirs),
            "best_rollflow": best(ours),
        }
    )
    worst = None if not diffs or None in diffs else max(diffs)
    results.goal(
        f"largest |rollflow - Vidur| / Vidur max QPS over {configurations} configurations (%)",
        worst,
        "<=",
        MAX_QPS_DIFF_PCT,
        headline=True,
    )
    same = best(theirs) is not None and best(theirs) == best(ours)
    results.goal("same best configuration by QPS per dollar (1: same)", int(same), "==", 1)
    if args.quick:
        results.goal(
            "search wall time, Vidur / rollflow, quick search", vidur_wall / wall, ">=", QUICK_MIN_SPEEDUP
        )
    else:
        results.goal(
            "search wall time, Vidur / rollflow", vidur_wall / wall, ">=", MIN_SPEEDUP, headline=True
        )
    results.goal("predictor files Vidur's timed search trained (warm-up missed them)", trained, "==", 0)
    probe_table(results, workdir, trace, args)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
