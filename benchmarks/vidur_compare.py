"""rollflow versus Vidur on the same requests, tables and scheduler settings: fidelity and speed.

    python benchmarks/vidur_compare.py --vidur-src ~/src/vidur --vidur-python ~/vidur-venv/bin/python
    VIDUR_SRC=... VIDUR_PYTHON=... python benchmarks/vidur_compare.py   # the same, from the environment
    python benchmarks/vidur_compare.py            # rollflow's side of the speed case only

Vidur is not a dependency of rollflow; it runs from its own source tree in its own virtual
environment, built once (Python 3.10+; its requirements.txt, no GPU needed):

    git clone https://github.com/microsoft/vidur ~/src/vidur   # only vidur/ and requirements.txt are used
    python3.11 -m venv ~/vidur-venv
    ~/vidur-venv/bin/pip install -r ~/src/vidur/requirements.txt

The source tree goes on Vidur's PYTHONPATH (not installed), rollflow's own tree on rollflow's,
so each side imports its own code.

Both simulators get the same `python -m vidur.main` flags (rollflow through `rollflow sim
from-vidur`), run from one work folder whose `data/profiling/...` holds Vidur's public MLP
and network tables (from ../shared/data/vidur) and an attention table written by
../shared/tools/attention_table.py, since Vidur's data has none. Prints, per config, p50/p90
of TTFT, TPOT and E2E from both and their relative difference; then, on the speed config,
whole-process wall time, start-up before the loop, the simulation loop (Vidur's
`Simulator.run()` versus rollflow's event loop, both without start-up or predictor loading),
output writing (Vidur's `_write_output`, which it otherwise runs from an atexit hook, versus
rollflow's requests.csv and chrome trace) and peak memory, with their ratios; rollflow also
with its two plots (the flags turn plots off on both sides). Without Vidur's source, only
rollflow's side of the speed case runs.
Vidur trains its random forests on its first run in a work folder and caches them there; the
benchmark makes that run a 100-request warm-up before timing anything, so every timed Vidur run
is warm. `--cold` measures a cold start once with an empty cache. rollflow likewise caches the
operator grids it builds from the tables (rollflow/perf/grid_cache.py); a 100-request rollflow
run on the speed case's replicas fills that cache first, so its timed runs are warm too. No
Vidur code is copied: it runs from the checkout.
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
# `--vidur-quick-training`: one random-forest setting instead of Vidur's 27-point grid with 10-fold
# cross-validation. It changes only Vidur's cold start (training and the cached prediction
# tables) and so its execution times a little; its warm start-up and loop do the same work.
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
json.dump({"setup_s": t1 - t0, "sim_loop_s": t2 - t1, "output_s": t3 - t2,
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
SPEED_CASE = Case("speed: splitwise_conv, sarathi x4", "sarathi", 4, None, 0.3)


@dataclass
class Run:
    summary: dict  # metric -> {p50, p90, ...}
    wall_s: float
    sim_loop_s: float
    setup_s: float
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


def prepare_workdir(workdir: Path, data: Path) -> None:
    """data/profiling/... as Vidur's default paths expect, with a generated attention table."""
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
            [sys.executable, str(SHARED / "tools" / "attention_table.py"), "--embd", "4096", "--q-heads", "32",
             "--kv-heads", "32", "--device", "a100", "--tp", "1,2,4", str(attention)],
            check=True,
        )  # fmt: skip


def trace_for(case: Case, workdir: Path, data: Path) -> Path:
    source = data / "processed_traces" / "splitwise_conv.csv"
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


def run_vidur(case: Case, args: argparse.Namespace, workdir: Path, trace: Path, tag: str, env: dict) -> Run:
    """Vidur's whole process (`VIDUR_TIMER`), from its own source tree and Python."""
    out = workdir / "out" / f"vidur-{tag}"
    timings = workdir / f"vidur-{tag}-timings.json"
    cmd = [args.vidur_python, "-c", VIDUR_TIMER, str(timings), *case.flags(trace), *vidur_training(args),
           "--metrics_config_output_dir", str(out)]  # fmt: skip
    wall, rss = measure(cmd, workdir, env, workdir / f"vidur-{tag}.log")
    info = json.loads(timings.read_text())
    with open(Path(info["output_dir"]) / "request_metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    summary = {key: distribution(np.array([float(r[col]) for r in rows])) for key, col in METRICS.items()}
    summary["num_requests"] = len(rows)
    return Run(summary, wall, info["sim_loop_s"], info["setup_s"], info["output_s"], rss)


def vidur_training(args: argparse.Namespace) -> list[str]:
    return QUICK_TRAINING if args.vidur_quick_training else []


def run_rollflow(case: Case, workdir: Path, trace: Path, tag: str, env: dict, plots: bool = False) -> Run:
    """The same flags as Vidur's run (plots off, as `--no-metrics_config_store_plots` says), or with plots."""
    out = workdir / "out" / f"rollflow-{tag}"
    flags = [f for f in case.flags(trace) if not (plots and f == "--no-metrics_config_store_plots")]
    cmd = [sys.executable, "-m", "rollflow.cli", "sim", "from-vidur", "--output-dir", str(out), "--",
           *flags]  # fmt: skip
    wall, rss = measure(cmd, workdir, env, workdir / f"rollflow-{tag}.log")
    summary = json.loads((out / "summary.json").read_text())
    return Run(summary, wall, summary["sim_loop_s"], summary["setup_s"], summary["output_s"], rss)


def speed_table(runs: dict[str, Run]) -> str:
    """One column per run, and Vidur's time over each rollflow run's where Vidur ran."""
    names = list(runs)
    vidur = runs.get("Vidur")
    ratios = [name for name in names if vidur is not None and name != "Vidur"]
    rows = [
        ("whole-process wall time (s)", lambda r: r.wall_s, "{:.2f}"),
        ("start-up before the loop (s)", lambda r: r.setup_s, "{:.2f}"),
        ("simulation loop (s)", lambda r: r.sim_loop_s, "{:.2f}"),
        ("output writing (s)", lambda r: r.output_s, "{:.2f}"),
        ("simulated requests per CPU-second of loop", lambda r: r.summary["num_requests"] / r.sim_loop_s, "{:,.0f}"),
        ("peak memory (MiB)", lambda r: r.peak_rss_mb, "{:.0f}"),
    ]  # fmt: skip
    lines = ["| measure | " + " | ".join(names) + "".join(f" | Vidur / {n}" for n in ratios) + " |",
             "|---|" + "---:|" * (len(names) + len(ratios))]  # fmt: skip
    for label, value, fmt in rows:
        cells = [fmt.format(value(runs[n])) for n in names]
        if "per CPU-second" in label:
            cells += [f"{value(runs[n]) / value(vidur):.1f}x" for n in ratios]  # higher is better
        else:
            cells += [f"{value(vidur) / value(runs[n]):.1f}x" for n in ratios]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fidelity_table(rows: list[tuple[str, Run, Run]]) -> str:
    lines = ["| config | metric | Vidur p50 | rollflow p50 | diff | Vidur p90 | rollflow p90 | diff |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, vidur, ours in rows:
        for metric in ("ttft", "tpot", "e2e"):
            cells = []
            for p in ("p50", "p90"):
                v, o = vidur.summary[metric][p], ours.summary[metric][p]
                cells += [f"{v:.4f}", f"{o:.4f}", f"{100 * (o - v) / v:+.1f}%"]
            lines.append(f"| {name} | {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--vidur-src",
        type=Path,
        default=os.environ.get("VIDUR_SRC"),
        help="source tree of microsoft/vidur, the folder holding vidur/ (default: $VIDUR_SRC; "
        "omit both: rollflow's speed case only)",
    )
    parser.add_argument(
        "--vidur-python",
        default=os.environ.get("VIDUR_PYTHON", sys.executable),
        help="python of a virtual environment with Vidur's requirements.txt (default: $VIDUR_PYTHON)",
    )
    parser.add_argument(
        "--vidur-quick-training",
        action="store_true",
        help="train Vidur's random forests with one setting and 2-fold CV instead of its grid "
        "(a cold start of minutes instead of most of an hour; the speed figures are warm)",
    )
    parser.add_argument(
        "--data", type=Path, default=SHARED / "data" / "vidur", help="Vidur's public data folder"
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "outputs" / "bench" / "vidur")
    parser.add_argument("--skip-fidelity", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument(
        "--cold", action="store_true", help="also time Vidur's cold start (random-forest training)"
    )
    args = parser.parse_args()

    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    prepare_workdir(workdir, args.data.resolve())
    base = {**os.environ, "WANDB_MODE": "disabled", "COLUMNS": "120"}
    env = {**base, "PYTHONPATH": str(REPO)}  # rollflow's side: this tree, not an installed copy
    vidur_env = None
    if args.vidur_src is not None:
        if not (args.vidur_src / "vidur" / "main.py").is_file():
            sys.exit(f"--vidur-src {args.vidur_src}: no vidur/main.py there")
        vidur_env = {**base, "PYTHONPATH": str(args.vidur_src.resolve())}
    else:
        print("no --vidur-src: Vidur does not run; fidelity skipped, speed case measured for rollflow only")

    if vidur_env is not None and not any((workdir / "cache").glob("*_predictions.pkl")):
        # Vidur's first run trains its random forests and caches them in workdir/cache.
        warm_case = Case("cache warm-up", "sarathi", 1, 100, 1.0)
        print("Vidur's cache is empty: training its random forests once (cold start) ...", flush=True)
        start = time.perf_counter()
        run_vidur(
            warm_case, args, workdir, trace_for(warm_case, workdir, args.data.resolve()), "warmup", vidur_env
        )
        print(f"Vidur cold start incl. random-forest training: {time.perf_counter() - start:.0f} s")

    if not args.skip_fidelity and vidur_env is not None:
        rows = []
        for i, case in enumerate(FIDELITY_CASES):
            trace = trace_for(case, workdir, args.data.resolve())
            print(f"[{i + 1}/{len(FIDELITY_CASES)}] {case.name} ...", flush=True)
            rows.append((case.name, run_vidur(case, args, workdir, trace, f"f{i}", vidur_env),
                         run_rollflow(case, workdir, trace, f"f{i}", env)))  # fmt: skip
        print("\nFidelity (seconds; diff = rollflow vs Vidur)\n" + fidelity_table(rows))

    if not args.skip_speed:
        case = SPEED_CASE
        trace = trace_for(case, workdir, args.data.resolve())
        print(f"\n{case.name} ...", flush=True)
        warm_case = Case("grid cache warm-up", case.scheduler, case.replicas, 100, case.time_scale)
        run_rollflow(warm_case, workdir, trace_for(warm_case, workdir, args.data.resolve()), "warmup", env)
        runs: dict[str, Run] = {}
        if vidur_env is not None:
            runs["Vidur"] = run_vidur(case, args, workdir, trace, "speed", vidur_env)
        runs["rollflow"] = run_rollflow(case, workdir, trace, "speed", env)
        runs["rollflow, with plots"] = run_rollflow(case, workdir, trace, "speed-plots", env, plots=True)
        print("\n" + speed_table(runs))
        if args.cold and vidur_env is not None:
            with tempfile.TemporaryDirectory() as cache:
                cold_case_flags = ["--metrics_config_cache_dir", cache]
                cmd = [args.vidur_python, "-c", VIDUR_TIMER, str(workdir / "cold.json"), *case.flags(trace),
                       *vidur_training(args), *cold_case_flags, "--metrics_config_output_dir", str(workdir / "out" / "vidur-cold")]  # fmt: skip
                wall, _ = measure(cmd, workdir, vidur_env, workdir / "vidur-cold.log")
            print(f"| Vidur cold start incl. random-forest training (s) | {wall:.0f} | | |")


if __name__ == "__main__":
    main()
