"""Vidur's config explorer against `rollflow sim search` on one small space, side by side.

    python benchmarks/search_vs_vidur.py --vidur-src ~/src/vidur --vidur-python ~/vidur-venv/bin/python \\
        --vidur-quick-training

(or VIDUR_SRC / VIDUR_PYTHON in the environment; building Vidur's environment is described in
benchmarks/vidur_compare.py). The space is Vidur's search format: Llama-2-7B on 2 A100s with
Vidur's tables (MLP and network from ../shared/data/vidur, attention from
../shared/tools/attention_table.py), tensor parallel 1 (2 replicas) or 2 (1 replica), vLLM or
Sarathi with chunk 512 or 1024, batch cap 128; requests with the Splitwise conversation
trace's lengths arriving as a Poisson process; SLO: scheduling delay P99 <= 5 s (Vidur's
default metric). Prints each configuration's max QPS from both, the best configuration by QPS
per dollar each picks, and both wall times with their ratio.

Vidur's side is its own `CapacitySearch` (`vidur/config_optimizer/config_explorer`): its
bisection, its `python -m vidur.main` runs and its result files, one configuration per process
in a pool of `--workers`. Its Ray runner is not used: it reserves `os.cpu_count() - 2` cores
per node for searches, none on a 2-core machine, and would wait forever. With
`--vidur-quick-training` its simulations get the same one-setting random-forest flags as
vidur_compare.py's (otherwise the first run per tensor-parallel size trains Vidur's full grid:
most of an hour). One flag the explorer writes, `--synthetic_request_generator_config_max_tokens`,
is dropped from its command lines: `vidur.main` at the same commit no longer accepts it, so
every run failed. rollflow's side runs `rollflow sim search` through its CLI, once per
(tensor parallel, replicas) pair, from scratch (`--resume never`).

Both see the same requests: rollflow's workload takes `rng: vidur` (Vidur's own random streams
for seed 42: gaps from Python's `random`, the trace shuffled by numpy's legacy RandomState) and
`max_gap_factor: 3` (Vidur's Poisson generator clips every gap at 3 mean gaps, so its requests
arrive about 5% faster than the QPS it is given), so at every rate both simulate one list. After
the searches, every rate Vidur probed is simulated again by rollflow on the same requests, and the
scheduling delay P99 of both is printed side by side with their pass/fail verdicts: that
separates the simulators from the bisections. The bisections differ (Vidur's starts from
0..2 x start_qps and widens by 2x or 4x when the delay is far under the SLO; rollflow doubles from
start_qps, see rollflow/plan/bisect.py), each stopping within 2.5%. `--seeds` adds rollflow
searches with its own sampler (numpy, exact Poisson) for those seeds, to show how far sampling
alone moves a max QPS. `--reuse-vidur` prints the tables again from the last Vidur search's
results, run folders and wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vidur_compare import MODEL, QUICK_TRAINING, SHARED, prepare_workdir

REPO = Path(__file__).resolve().parents[1]
NUM_GPUS = 2
LAYOUTS = [(1, 2), (2, 1)]  # (tensor parallel, replicas) on NUM_GPUS GPUs, as Vidur's explorer derives them
SCHEDULERS = [("vllm", None), ("sarathi", 512), ("sarathi", 1024)]
BATCH_SIZE_CAP = 128
SLO_S = 5.0
START_QPS = 2.0
GRANULARITY_PCT = 2.5
PRICE_PER_GPU_HOUR = 2.0  # a100; only ratios matter for the pick
# Flags the explorer (at Vidur's HEAD) still writes but `vidur.main` no longer accepts: every
# run would fail with "unrecognized arguments". It has no effect on a trace-length workload.
STALE_EXPLORER_FLAGS = ["--synthetic_request_generator_config_max_tokens"]
VIDUR_SEED = 42  # Vidur's default request-generator seed, which its explorer keeps
VIDUR_MAX_GAP_FACTOR = 3.0  # its Poisson generator clips every gap at 3 mean gaps

# Runs Vidur's CapacitySearch per configuration in a process pool; writes results and wall time.
VIDUR_DRIVER = """
import argparse, json, multiprocessing, sys, time
from vidur.config_optimizer.config_explorer.capacity_search import CapacitySearch
from vidur.config_optimizer.config_explorer.config import JobConfig

spec = json.loads(sys.argv[1])

class Search(CapacitySearch):
    def _generate_run_command(self, scheduler_config):
        words = super()._generate_run_command(scheduler_config).split()
        for flag in spec["drop_flags"]:  # with its value
            if flag in words:
                index = words.index(flag)
                del words[index:index + 2]
        return " ".join(words + spec["extra_flags"])

def search(job):
    start = time.perf_counter()
    result = Search(job, argparse.Namespace(**spec["args"])).search()
    return {**result, "seconds": time.perf_counter() - start}

if __name__ == "__main__":
    jobs = JobConfig.generate_job_configs(spec["explorer"])
    start = time.perf_counter()
    with multiprocessing.Pool(spec["workers"]) as pool:
        results = pool.map(search, jobs, chunksize=1)
    json.dump({"wall_s": time.perf_counter() - start, "results": results}, open(spec["out"], "w"))
"""


def explorer_config(trace: Path, num_requests: int) -> dict:
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
            {"scheduler": kind, **({"chunk_size": chunk} if chunk else {})} for kind, chunk in SCHEDULERS
        ],
        "tp_dimensions": [tp for tp, _ in LAYOUTS],
        "pp_dimensions": [1],
        "batch_sizes": [BATCH_SIZE_CAP],
    }


def run_vidur(args: argparse.Namespace, workdir: Path, trace: Path) -> dict:
    out = workdir / "vidur-search.json"
    spec = {
        "explorer": explorer_config(trace, args.num_requests),
        "args": {
            "output_dir": str(workdir / "vidur-search"),
            "cache_dir": str(workdir / "cache"),
            "time_limit": 30,  # minutes of simulated time, Vidur's default
            "scheduling_delay_slo_value": SLO_S,
            "scheduling_delay_slo_quantile": 0.99,
            "max_iterations": 20,
            "min_search_granularity": GRANULARITY_PCT,
        },
        "extra_flags": QUICK_TRAINING if args.vidur_quick_training else [],
        "drop_flags": STALE_EXPLORER_FLAGS,
        "workers": args.workers,
        "out": str(out),
    }
    python_dir = str(Path(args.vidur_python).parent)  # its runs call `python -m vidur.main`
    env = {
        **os.environ,
        "PYTHONPATH": str(args.vidur_src.resolve()),
        "PATH": python_dir + os.pathsep + os.environ["PATH"],
        "WANDB_MODE": "disabled",
    }
    with (workdir / "vidur-search.log").open("w") as log:
        subprocess.run(
            [args.vidur_python, "-c", VIDUR_DRIVER, json.dumps(spec)],
            cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, check=True,
        )  # fmt: skip
    return json.loads(out.read_text())


def rollflow_config(
    workdir: Path, trace: Path, num_requests: int, tp: int, replicas: int, workers: int, seed: int | None
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
            "scheduler": sorted({kind for kind, _ in SCHEDULERS}),
            "chunk_size": sorted({chunk for _, chunk in SCHEDULERS if chunk}),
            "batch_size_cap": [BATCH_SIZE_CAP],
        },
        "bisection": {"start_qps": START_QPS, "tolerance": GRANULARITY_PCT / 100},
        "workers": workers,
    }


def run_rollflow(
    args: argparse.Namespace, workdir: Path, trace: Path, seed: int | None
) -> tuple[float, list[dict]]:
    """One whole search (every layout): its wall time and rows. Seed None: Vidur's requests."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows: list[dict] = []
    start = time.perf_counter()
    for tp, replicas in LAYOUTS:
        name = f"rollflow-search-{'vidur-requests' if seed is None else f'seed{seed}'}-tp{tp}"
        config = workdir / f"{name}.yaml"
        raw = rollflow_config(workdir, trace, args.num_requests, tp, replicas, args.workers, seed)
        config.write_text(yaml.safe_dump(raw))
        out = workdir / name
        with (workdir / f"{name}.log").open("w") as log:
            subprocess.run(
                [sys.executable, "-m", "rollflow.cli", "sim", "search", "--config", str(config),
                 "--output-dir", str(out), "--resume", "never"],
                cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, check=True,
            )  # fmt: skip
        rows += json.loads((out / "results.json").read_text())
    return time.perf_counter() - start, rows


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


def rollflow_p99(workdir: Path, trace: Path, num_requests: int, name: str, qps: float) -> float:
    """rollflow's scheduling delay P99 for configuration `name` at `qps`, on Vidur's requests."""
    from rollflow.config import validate_config
    from rollflow.plan.space import apply_knobs
    from rollflow.sim.config import SimConfig
    from rollflow.sim.runner import run_simulation

    tp = int(name[2])
    kind, _, chunk = name.split(", ")[1].partition("/")
    raw = rollflow_config(workdir, trace, num_requests, tp, NUM_GPUS // tp, 1, None)
    knobs = {"device": "a100", "tensor_parallel": tp, "pipeline_stages": 1, "replicas": NUM_GPUS // tp,
             "router": "round_robin", "scheduler": kind, "batch_size_cap": BATCH_SIZE_CAP,
             "chunk_size": int(chunk) if chunk else None}  # fmt: skip
    sim = apply_knobs(raw["simulation"], knobs, qps)
    sim["output"] = {"dir": str(workdir / "rollflow-probe"), "plots": False, "chrome_trace": False,
                     "requests_csv": False, "progress": False}  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        summary = run_simulation(validate_config(SimConfig, sim))
    return float(summary["scheduling_delay"]["p99"])


def print_probe_table(workdir: Path, trace: Path, num_requests: int) -> None:
    """Vidur's P99 at every rate it probed beside rollflow's on the same requests, and verdicts."""
    probes = vidur_probes(workdir)
    print(f"\nscheduling delay P99 (s) at every rate Vidur probed, same requests (SLO {SLO_S:g} s)")
    print("| configuration | QPS | Vidur P99 | rollflow P99 | diff | verdicts |")
    print("|---|---:|---:|---:|---:|---|")
    agree, diffs = 0, []
    for name, qps, theirs in probes:
        mine = rollflow_p99(workdir, trace, num_requests, name, qps)
        same = (mine <= SLO_S) == (theirs <= SLO_S)
        agree += same
        diff = f"{100 * (mine - theirs) / theirs:+.1f}%" if theirs > 0 else ""
        if theirs > 0:
            diffs.append((mine - theirs) / theirs)
        verdict = ("both pass" if mine <= SLO_S else "both fail") if same else "differ"
        print(f"| {name} | {qps:g} | {theirs:.3f} | {mine:.3f} | {diff} | {verdict} |")
    if diffs:
        print(f"verdicts agree at {agree} of {len(probes)} rates; P99 diff (rollflow against Vidur) "
              f"median {100 * float(np.median(diffs)):+.1f}%, range {100 * min(diffs):+.1f}% to {100 * max(diffs):+.1f}%")  # fmt: skip


def best(table: dict[str, tuple[float | None, float]]) -> str:
    """Capacity per dollar: every configuration uses NUM_GPUS GPUs at one price, so the highest QPS."""
    return max((k for k, (qps, _) in table.items() if qps), key=lambda k: table[k][0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vidur-src", type=Path, default=os.environ.get("VIDUR_SRC"),
                        help="source tree of microsoft/vidur, the folder holding vidur/ (default: $VIDUR_SRC)")  # fmt: skip
    parser.add_argument("--vidur-python", default=os.environ.get("VIDUR_PYTHON", sys.executable),
                        help="python of a virtual environment with Vidur's requirements (default: $VIDUR_PYTHON)")  # fmt: skip
    parser.add_argument("--vidur-quick-training", action="store_true",
                        help="one random-forest setting for Vidur's predictors (see vidur_compare.py)")  # fmt: skip
    parser.add_argument("--num-requests", type=int, default=1000, help="requests per simulation (both sides)")
    parser.add_argument("--workers", type=int, default=2, help="configurations searched at once (both sides)")
    parser.add_argument(
        "--data", type=Path, default=SHARED / "data" / "vidur", help="Vidur's public data folder"
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "outputs" / "bench" / "vidur")
    parser.add_argument("--skip-vidur", action="store_true", help="rollflow's side only")
    parser.add_argument(
        "--reuse-vidur",
        action="store_true",
        help="read Vidur's results and wall time from the last run's WORKDIR/vidur-search.json "
        "instead of searching again (its run folders would answer from cache, which is not timing it)",
    )
    parser.add_argument(
        "--seeds",
        default="",
        help="also search with rollflow's own sampler (numpy, exact Poisson) at these comma-separated "
        "seeds, for each configuration's range of max QPS under sampling noise (default: none)",
    )
    args = parser.parse_args()

    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    data = args.data.resolve()
    prepare_workdir(workdir, data)
    trace = data / "processed_traces" / "splitwise_conv.csv"
    seeds = [int(s) for s in args.seeds.split(",") if s]

    theirs: dict[str, tuple[float | None, float]] = {}
    vidur_wall = float("nan")
    if not args.skip_vidur:
        if not args.reuse_vidur and args.vidur_src is None:
            sys.exit("--vidur-src (or VIDUR_SRC) is needed to run Vidur's search")
        print(f"Vidur's capacity search: {len(LAYOUTS) * len(SCHEDULERS)} configurations ...", flush=True)
        last = workdir / "vidur-search.json"
        vidur = json.loads(last.read_text()) if args.reuse_vidur else run_vidur(args, workdir, trace)
        vidur_wall = vidur["wall_s"]
        theirs = vidur_rows(vidur["results"])
    print("rollflow sim search on Vidur's requests ...", flush=True)
    wall, rows = run_rollflow(args, workdir, trace, None)
    ours = rollflow_rows(rows)
    by_seed: list[dict[str, tuple[float | None, float]]] = []
    for seed in seeds:
        print(f"rollflow sim search, own sampler, seed {seed} ...", flush=True)
        by_seed.append(rollflow_rows(run_rollflow(args, workdir, trace, seed)[1]))

    print(f"\nmax QPS with scheduling delay P99 <= {SLO_S:g} s ({args.num_requests} requests per simulation)")
    ranges = f" rollflow's sampler, seeds {args.seeds}: min-max |" if seeds else ""
    print(f"| configuration | Vidur | rollflow, same requests | diff |{ranges} Vidur s | rollflow s |")
    print("|---|---:|---:|---:|" + ("---|" if seeds else "") + "---:|---:|")
    within = 0
    for name in sorted(ours):
        mine, mine_s = ours[name]
        other, other_s = theirs.get(name, (None, float("nan")))
        within += bool(mine and other) and abs(mine - other) <= 0.05 * other
        diff = f"{100 * (mine - other) / other:+.1f}%" if mine and other else ""
        cells = [f"{other:.2f}" if other else "-", f"{mine:.2f}" if mine else "-", diff]
        if seeds:
            values = [t[name][0] or 0.0 for t in by_seed]
            cells.append(f"{min(values):.2f}-{max(values):.2f}")
        print(f"| {name} | " + " | ".join([*cells, f"{other_s:.0f}", f"{mine_s:.1f}"]) + " |")
    print(f"\nbest by QPS per dollar (all use {NUM_GPUS} GPUs at one price: the highest QPS): "
          f"rollflow: {best(ours)}" + (f"; Vidur: {best(theirs)}" if theirs else ""))  # fmt: skip
    print(f"rollflow's search: {wall:.1f} s wall")
    if theirs:
        print(f"Vidur's search: {vidur_wall:.0f} s wall; Vidur / rollflow {vidur_wall / wall:.1f}x; "
              f"max QPS within 5% of Vidur's for {within} of {len(ours)} configurations")  # fmt: skip
        print_probe_table(workdir, trace, args.num_requests)


if __name__ == "__main__":
    main()
