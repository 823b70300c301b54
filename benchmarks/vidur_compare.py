"""rollflow versus Vidur on the same requests, tables and scheduler settings: fidelity and speed.

    .venv/bin/python benchmarks/vidur_compare.py
    .venv/bin/python benchmarks/vidur_compare.py --quick    # smaller fidelity traces, one speed round

Vidur runs at a pinned commit from its own checkout in its own virtual environment, both set up
by the benchmark (benchmarks/vidur_peer.py: `--vidur-src`/`VIDUR_SRC` or `VIDUR_GIT` say where its
source comes from). Both simulators get the same `python -m vidur.main` flags (rollflow through
`rollflow sim from-vidur`), run from one work folder whose `data/profiling/...` holds Vidur's
public MLP and network tables (from ../shared/data/vidur) and an attention table written by
../shared/tools/attention_table.py, since Vidur's data has none.

Fidelity: per config, p50/p90 of TTFT, TPOT and E2E from both (goal: every one within 5%).
Speed, on the speed case, each side's best of `--repeats` rounds taken in turns (Vidur, rollflow,
rollflow with plots, again): whole-process wall time, start-up, simulation (Vidur's
`Simulator.run()`, which updates its metric store as it goes, against rollflow's event loop plus
its request table and summary), output writing (Vidur's `_write_output`, which it otherwise runs
from an atexit hook, against rollflow's requests.csv and chrome trace) and peak memory.

Vidur's execution-time predictor trains random forests on its first run for a tensor-parallel
size and caches them in the work folder. Before timing anything the benchmark runs Vidur once on
100 requests with the same flags (tensor parallel 1, the only size used here), recording whether
that trained and how long it took, and counts the cache's files around every timed Vidur run: a
timed run that trained fails the run. `--vidur-full-training` trains Vidur's 27-point grid with
10-fold cross-validation (most of an hour cold) instead of one setting (`QUICK_TRAINING`).
rollflow likewise caches the operator grids it builds from the tables; a 100-request rollflow run
fills that cache first. No Vidur code is copied: it runs from the checkout.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, add_inputs, add_shared_dir, benchmark_parser, fill_inputs, results_dir
from vidur_peer import Vidur, add_vidur_options, ensure_vidur, venv_versions

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MODEL = "meta-llama/Llama-2-7b-hf"
COMMON = [
    "--replica_config_model_name", MODEL,
    "--replica_config_device", "a100",
    "--replica_config_network_device", "a100_pairwise_nvlink",
    "--global_scheduler_config_type", "round_robin",
    "--request_generator_config_type", "trace_replay",
    "--trace_request_generator_config_max_tokens", "4096",
    "--no-metrics_config_store_plots",
]  # fmt: skip
# One random-forest setting instead of Vidur's 27-point grid with 10-fold cross-validation. It
# changes only Vidur's cold start (training and the cached prediction tables) and so its execution
# times a little; its warm start-up and loop do the same work.
QUICK_TRAINING = [
    "--random_forrest_execution_time_predictor_config_num_estimators", "250",
    "--random_forrest_execution_time_predictor_config_max_depth", "32",
    "--random_forrest_execution_time_predictor_config_min_samples_split", "2",
    "--random_forrest_execution_time_predictor_config_k_fold_cv_splits", "2",
]  # fmt: skip
METRICS = {  # summary.json key -> Vidur request_metrics.csv column
    "ttft": "prefill_e2e_time",
    "tpot": "decode_time_execution_plus_preemption_normalized",
    "e2e": "request_e2e_time",
    "scheduling_delay": "request_scheduling_delay",
}
FIDELITY_GOAL_PCT = 5.0
# The speed goals of docs/guides/serving-simulator.md, on the whole trace.
MAX_WALL_S, MAX_WALL_PLOTS_S = 1.0, 1.5
MIN_WALL_RATIO, MIN_WALL_PLOTS_RATIO, MIN_SIM_RATIO = 45.0, 30.0, 100.0

# Runs Vidur's own entry point, timing construction (predictor loading) and Simulator.run() apart.
VIDUR_TIMER = """
import json, sys, time
timings_path = sys.argv.pop(1)
t0 = time.perf_counter()
from vidur.config import SimulationConfig
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
simulator = Simulator(config)
t1 = time.perf_counter()
simulator.run()
t2 = time.perf_counter()
import atexit
atexit.unregister(simulator._write_output)  # timed here instead of at exit
simulator._write_output()
t3 = time.perf_counter()
json.dump({"setup_s": t1 - t0, "sim_s": t2 - t1, "output_s": t3 - t2,
           "output_dir": config.metrics_config.output_dir}, open(timings_path, "w"))
"""


@dataclass(frozen=True)
class Case:
    name: str
    scheduler: str
    replicas: int
    trace_rows: int | None  # None: the whole trace
    time_scale: float

    def flags(self, trace: Path) -> list[str]:
        flags = [
            *COMMON,
            "--replica_scheduler_config_type", self.scheduler,
            "--cluster_config_num_replicas", str(self.replicas),
            "--trace_request_generator_config_trace_file", str(trace),
            "--trace_request_generator_config_time_scale_factor", str(self.time_scale),
        ]  # fmt: skip
        if self.scheduler == "sarathi":
            flags += ["--sarathi_scheduler_config_chunk_size", "512"]
        return flags


FIDELITY_CASES = [
    Case("vllm, 1 replica", "vllm", 1, 2000, 1.0),
    Case("sarathi, 1 replica", "sarathi", 1, 2000, 1.0),
    Case("vllm, 4 replicas", "vllm", 4, 4000, 0.3),
    Case("sarathi, 4 replicas", "sarathi", 4, 4000, 0.3),
]
SPEED_CASE = Case("splitwise_conv, sarathi x4", "sarathi", 4, None, 0.3)
QUICK_FIDELITY_CASES = [
    Case("vllm, 1 replica", "vllm", 1, 300, 1.0),
    Case("sarathi, 4 replicas", "sarathi", 4, 800, 0.3),
]
WARMUP_ROWS = 100
FULL = {"repeats": 3}
QUICK = {"repeats": 1}
"""Inputs of a run and of a `--quick` one; an option given on the command line wins over both."""


@dataclass
class Run:
    summary: dict  # metric -> {p50, p90, ...}, and num_requests
    wall_s: float  # the whole child process, as this benchmark sees it
    setup_s: float  # before the loop: imports, config, predictors or grids, trace
    sim_s: float  # the loop with its metric bookkeeping (Vidur's metric store; rollflow's table and summary)
    output_s: float
    peak_rss_mb: float


def measure(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"command failed ({log}): {' '.join(cmd)}")
    return wall, usage.ru_maxrss / 1024


def add_folder_options(parser: argparse.ArgumentParser) -> None:
    """`--shared` (Vidur's public data, the attention table tool) and `--workdir` (what Vidur reads and
    writes): the Vidur benchmarks' one working folder, whose trained predictors each run reuses."""
    add_shared_dir(parser)
    parser.add_argument("--workdir", type=Path, default=REPO / "outputs" / "bench" / "vidur")


def prepare_workdir(args: argparse.Namespace) -> tuple[Path, Path]:
    """(--workdir, --shared), resolved; --workdir made, holding data/profiling/... as Vidur's default
    paths expect, with a generated attention table."""
    workdir, shared = args.workdir.resolve(), args.shared.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    data, tool = shared / "data" / "vidur", shared / "tools" / "attention_table.py"
    if not (data / "profiling" / "compute" / "a100" / MODEL / "mlp.csv").is_file() or not tool.is_file():
        sys.exit(f"{shared}: no data/vidur (Vidur's public data) and tools/attention_table.py there; "
                 "give --shared the project's shared folder")  # fmt: skip
    compute = workdir / "data" / "profiling" / "compute" / "a100" / MODEL
    compute.mkdir(parents=True, exist_ok=True)
    mlp = compute / "mlp.csv"
    if not mlp.exists():
        mlp.symlink_to(data / "profiling" / "compute" / "a100" / MODEL / "mlp.csv")
    network = workdir / "data" / "profiling" / "network"
    if not network.exists():
        network.symlink_to(data / "profiling" / "network")
    attention = compute / "attention.csv"
    if not attention.exists():
        subprocess.run(
            [sys.executable, str(tool), "--embd", "4096", "--q-heads", "32",
             "--kv-heads", "32", "--device", "a100", "--tp", "1,2,4", str(attention)],
            check=True,
        )  # fmt: skip
    return workdir, shared


def trace_for(case: Case, workdir: Path, shared: Path) -> Path:
    source = shared / "data" / "vidur" / "processed_traces" / "splitwise_conv.csv"
    if case.trace_rows is None:
        return source
    subset = workdir / "traces" / f"conv{case.trace_rows}.csv"
    subset.parent.mkdir(exist_ok=True)
    lines = source.read_text().splitlines()[: case.trace_rows + 1]
    subset.write_text("\n".join(lines) + "\n")
    return subset


def distribution(values: np.ndarray) -> dict[str, float]:
    return {"p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90)),
            "p99": float(np.percentile(values, 99)), "mean": float(values.mean())}  # fmt: skip


def cached_predictors(workdir: Path) -> int:
    """Files in Vidur's predictor cache: a run that adds some trained a model or its predictions."""
    return len(list((workdir / "cache").glob("*.pkl")))


def run_vidur(case: Case, vidur: Vidur, training: list[str], workdir: Path, trace: Path, tag: str) -> Run:
    """Vidur's whole process (`VIDUR_TIMER`), from its own source tree and Python."""
    out = workdir / "out" / f"vidur-{tag}"
    timings = workdir / f"vidur-{tag}-timings.json"
    cmd = [str(vidur.python), "-c", VIDUR_TIMER, str(timings), *case.flags(trace), *training,
           "--metrics_config_output_dir", str(out)]  # fmt: skip
    wall, rss = measure(cmd, workdir, vidur.env(COLUMNS="120"), workdir / f"vidur-{tag}.log")
    info = json.loads(timings.read_text())
    with open(Path(info["output_dir"]) / "request_metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    summary = {key: distribution(np.array([float(r[col]) for r in rows])) for key, col in METRICS.items()}
    summary["num_requests"] = len(rows)
    return Run(summary, wall, info["setup_s"], info["sim_s"], info["output_s"], rss)


def run_rollflow(case: Case, workdir: Path, trace: Path, tag: str, plots: bool = False) -> Run:
    """The same flags as Vidur's run (plots off, as `--no-metrics_config_store_plots` says), or with
    plots. Its simulation time is the loop plus the request table and summary (what lies between
    the end of start-up and the start of output writing), as Vidur's includes its metric store."""
    out = workdir / "out" / f"rollflow-{tag}"
    flags = [f for f in case.flags(trace) if not (plots and f == "--no-metrics_config_store_plots")]
    cmd = [sys.executable, "-m", "rollflow.cli", "sim", "from-vidur", "--output-dir", str(out), "--",
           *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this tree, not an installed copy
    wall, rss = measure(cmd, workdir, env, workdir / f"rollflow-{tag}.log")
    summary = json.loads((out / "summary.json").read_text())
    sim_s = summary["wall_time_s"] - summary["setup_s"] - summary["output_s"]
    return Run(summary, wall, summary["setup_s"], sim_s, summary["output_s"], rss)


def fidelity(results: Results, rows: list[tuple[str, Run, Run]]) -> None:
    """The per-config table and the largest relative difference as the goal."""
    table, diffs = [], []
    for name, vidur, ours in rows:
        for metric in ("ttft", "tpot", "e2e"):
            cells: list = [name, metric]
            for p in ("p50", "p90"):
                v, o = vidur.summary[metric][p], ours.summary[metric][p]
                diff = 100 * (o - v) / v
                diffs.append(abs(diff))
                cells += [round(v, 4), round(o, 4), f"{diff:+.1f}%"]
            table.append(cells)
    results.table(
        "Fidelity (seconds; diff = rollflow against Vidur)",
        ["config", "metric", "Vidur p50", "rollflow p50", "diff", "Vidur p90", "rollflow p90", "diff"],
        table,
    )
    results.figures["fidelity_max_abs_diff_pct"] = max(diffs)
    results.goal(
        f"largest |rollflow - Vidur| / Vidur, TTFT, TPOT and E2E at p50 and p90, {len(rows)} configs (%)",
        max(diffs),
        "<=",
        FIDELITY_GOAL_PCT,
        headline=True,
    )


def best(runs: list[Run]) -> Run:
    """Each measure's best (lowest) over the rounds, the same rule for both sides."""
    fields = ("wall_s", "setup_s", "sim_s", "output_s", "peak_rss_mb")
    return Run(runs[0].summary, *(min(getattr(r, f) for r in runs) for f in fields))


def speed(results: Results, case: Case, runs: dict[str, Run]) -> None:
    vidur, ours, plots = runs["Vidur"], runs["rollflow"], runs["rollflow, with plots"]
    measures = [
        ("whole-process wall time (s)", "wall_s"),
        ("start-up before the loop (s)", "setup_s"),
        ("simulation with its metric bookkeeping (s)", "sim_s"),
        ("output writing (s)", "output_s"),
        ("peak memory (MiB)", "peak_rss_mb"),
    ]
    rows = [
        [label, *(round(getattr(r, field), 3) for r in runs.values()),
         f"{getattr(vidur, field) / getattr(ours, field):.1f}x",
         f"{getattr(vidur, field) / getattr(plots, field):.1f}x"]
        for label, field in measures
    ]  # fmt: skip
    results.table(
        f"Speed: {case.name}, {ours.summary['num_requests']:,} requests, best of each side's rounds",
        ["measure", *runs, "Vidur / rollflow", "Vidur / rollflow, with plots"],
        rows,
    )
    for name, run in runs.items():
        results.figures[name] = {
            "wall_s": run.wall_s, "setup_s": run.setup_s, "sim_s": run.sim_s, "output_s": run.output_s,
            "peak_rss_mb": run.peak_rss_mb, "requests_per_sim_second": run.summary["num_requests"] / run.sim_s,
        }  # fmt: skip
    results.goal("rollflow whole process, no plots (s)", ours.wall_s, "<=", MAX_WALL_S)
    results.goal("rollflow whole process, with plots (s)", plots.wall_s, "<=", MAX_WALL_PLOTS_S)
    results.goal(
        "whole process, Vidur / rollflow", vidur.wall_s / ours.wall_s, ">=", MIN_WALL_RATIO, headline=True
    )
    results.goal(
        "whole process, Vidur / rollflow with plots", vidur.wall_s / plots.wall_s, ">=", MIN_WALL_PLOTS_RATIO
    )
    results.goal(
        "simulation with metric bookkeeping, Vidur / rollflow", vidur.sim_s / ours.sim_s, ">=", MIN_SIM_RATIO
    )


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_vidur_options(parser)
    add_inputs(parser, FULL, {"repeats": "speed rounds, each side's best kept"})
    add_folder_options(parser)
    parser.add_argument(
        "--cold", action="store_true", help="also time Vidur's cold start (random-forest training), once"
    )
    args = parser.parse_args()
    fill_inputs(args, FULL, QUICK)
    results = Results("vidur_compare", results_dir(args))
    vidur = ensure_vidur(args.vidur_src)
    results.peers["vidur"] = vidur.commit
    results.figures["vidur_packages"] = venv_versions(vidur)
    training = [] if args.vidur_full_training else QUICK_TRAINING
    results.figures["vidur_training"] = (
        "full grid" if args.vidur_full_training else "one setting (QUICK_TRAINING)"
    )
    # The speed goals hold on the whole trace (a shorter one is mostly start-up), so --quick keeps
    # it and saves time on the fidelity traces and the number of speed rounds instead.
    fidelity_cases = QUICK_FIDELITY_CASES if args.quick else FIDELITY_CASES
    workdir, shared = prepare_workdir(args)

    warm_case = Case("predictor warm-up", "sarathi", 1, WARMUP_ROWS, 1.0)
    before = cached_predictors(workdir)
    start = time.perf_counter()
    run_vidur(warm_case, vidur, training, workdir, trace_for(warm_case, workdir, shared), "warmup")
    results.figures["vidur_warmup"] = {
        "tensor_parallel": [1],
        "requests": WARMUP_ROWS,
        "seconds": time.perf_counter() - start,
        "trained": cached_predictors(workdir) > before,
    }
    print(f"Vidur's predictors warmed for tensor parallel 1: {results.figures['vidur_warmup']}", flush=True)
    trained_in_timed_runs = 0

    def timed_vidur(case: Case, trace: Path, tag: str) -> Run:
        nonlocal trained_in_timed_runs
        before = cached_predictors(workdir)
        run = run_vidur(case, vidur, training, workdir, trace, tag)
        trained_in_timed_runs += cached_predictors(workdir) > before
        return run

    rows, unequal = [], 0
    for i, case in enumerate(fidelity_cases):
        trace = trace_for(case, workdir, shared)
        print(f"[{i + 1}/{len(fidelity_cases)}] {case.name} ...", flush=True)
        theirs = timed_vidur(case, trace, f"f{i}")
        ours = run_rollflow(case, workdir, trace, f"f{i}")
        unequal += theirs.summary["num_requests"] != ours.summary["num_requests"]
        rows.append((f"{case.name}, {case.trace_rows:,} req., time scale {case.time_scale}", theirs, ours))
    fidelity(results, rows)

    trace = trace_for(SPEED_CASE, workdir, shared)
    print(f"speed: {SPEED_CASE.name}, {args.repeats} round(s) ...", flush=True)
    warm_grid = Case(
        "grid cache warm-up", SPEED_CASE.scheduler, SPEED_CASE.replicas, WARMUP_ROWS, SPEED_CASE.time_scale
    )
    run_rollflow(warm_grid, workdir, trace_for(warm_grid, workdir, shared), "warmup")
    rounds: dict[str, list[Run]] = {"Vidur": [], "rollflow": [], "rollflow, with plots": []}
    for k in range(args.repeats):  # in turns, so a change in the machine's load touches every side
        rounds["Vidur"].append(timed_vidur(SPEED_CASE, trace, f"speed{k}"))
        rounds["rollflow"].append(run_rollflow(SPEED_CASE, workdir, trace, f"speed{k}"))
        rounds["rollflow, with plots"].append(
            run_rollflow(SPEED_CASE, workdir, trace, f"speed-plots{k}", plots=True)
        )
    for runs in rounds.values():
        unequal += any(r.summary["num_requests"] != rounds["Vidur"][0].summary["num_requests"] for r in runs)
    speed(results, SPEED_CASE, {name: best(runs) for name, runs in rounds.items()})
    results.figures["speed_rounds"] = args.repeats
    results.goal(
        "timed Vidur runs that trained a predictor (warm-up missed them)", trained_in_timed_runs, "==", 0
    )
    results.goal("runs whose completed requests differ from Vidur's", unequal, "==", 0)

    if args.cold:
        with tempfile.TemporaryDirectory() as cache:
            cmd = [str(vidur.python), "-c", VIDUR_TIMER, str(workdir / "cold.json"), *SPEED_CASE.flags(trace),
                   *training, "--metrics_config_cache_dir", cache,
                   "--metrics_config_output_dir", str(workdir / "out" / "vidur-cold")]  # fmt: skip
            results.figures["vidur_cold_start_s"], _ = measure(
                cmd, workdir, vidur.env(), workdir / "vidur-cold.log"
            )
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
