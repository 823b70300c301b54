"""Time `rollflow sim search` on a large space: Llama-3-8B on A100 and H100, 144 configurations.

    .venv/bin/python benchmarks/search_scale.py
    .venv/bin/python benchmarks/search_scale.py --quick    # 100 requests per simulation

Runs the search from scratch (`--resume never`) through the CLI, as a user would, and records the
wall time (the whole process), the number of configurations searched and simulations, and the five
best configurations by capacity per dollar. Goals: at least 100 configurations searched in under
10 minutes with 2 workers (the Vidur paper reports about an hour of CPU for its LLaMA2-70B
search). With 1,000 requests the largest configurations take a whole run as one burst, so their
max QPS is burst capacity; raise --num-requests for sustained. No peer runs: the figure is
rollflow's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, add_inputs, add_shared_dir, benchmark_parser, fill_inputs, results_dir

REPO = Path(__file__).resolve().parents[1]
MIN_CONFIGURATIONS = 100
MAX_WALL_S = 600.0
FULL = {"num_requests": 1000}
QUICK = {"num_requests": 100}
"""Inputs of a run and of a `--quick` one; an option given on the command line wins over both."""


def space_config(output_dir: Path, workers: int, num_requests: int, trace: Path) -> dict:
    return {
        "simulation": {
            "seed": 1,
            "cluster": {"model": "meta-llama/Meta-Llama-3-8B"},
            "execution": {"kind": "roofline"},
            "workload": {
                "kind": "synthetic",
                "num_requests": num_requests,
                "max_tokens": 4096,
                "lengths": {
                    "kind": "trace",
                    "file": str(trace),
                },
                "intervals": {"kind": "poisson"},
            },
        },
        # Scheduling delay alone passes any rate once a finite workload fits in the batch caps
        # (every request admitted on arrival); TTFT bounds the resulting prefill queueing.
        "slos": [
            {"metric": "scheduling_delay", "quantile": 99, "max_s": 5.0},
            {"metric": "ttft", "quantile": 90, "max_s": 2.0},
        ],
        "prices": {"a100": 2.0, "h100": 4.0},
        "space": {
            "device": ["a100", "h100"],
            "tensor_parallel": [1, 2, 4],
            "replicas": [1, 2, 4, 8],
            "scheduler": ["vllm", "sarathi"],
            "chunk_size": [512, 1024],
            "batch_size_cap": [64, 128],
        },
        "bisection": {"start_qps": 4.0, "tolerance": 0.05},
        "workers": workers,
        "output_dir": str(output_dir),
    }


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--workers", type=int, default=2)
    add_inputs(parser, FULL, {"num_requests": "requests per simulation"})
    parser.add_argument("--output-dir", default=str(REPO / "outputs/bench/search_scale"))
    add_shared_dir(parser)
    args = parser.parse_args()
    fill_inputs(args, FULL, QUICK)
    results = Results("search_scale", results_dir(args))
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "search.yaml"
    trace = args.shared / "data" / "vidur" / "processed_traces" / "splitwise_conv.csv"
    if not trace.is_file():
        sys.exit(f"{trace} not found: give --shared the folder holding data/vidur (Vidur's public data)")
    config.write_text(yaml.safe_dump(space_config(out, args.workers, args.num_requests, trace.resolve())))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "rollflow.cli", "sim", "search", "--config", str(config), "--resume", "never"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - started
    if proc.returncode:
        sys.exit(f"rollflow sim search failed:\n{proc.stderr[-2000:]}")
    rows = json.loads((out / "results.json").read_text())
    searched = [r for r in rows if not r["skipped"]]
    simulations = sum(r["simulations"] for r in rows)
    results.figures.update(
        {"configurations": len(rows), "searched": len(searched), "simulations": simulations, "wall_s": wall,
         "workers": args.workers, "num_requests": args.num_requests}
    )  # fmt: skip
    knobs = ("device", "tensor_parallel", "replicas", "scheduler", "chunk_size", "batch_size_cap")
    results.table(
        "Best five configurations by QPS per $/hour",
        [*knobs, "max QPS", "QPS per $/h"],
        [[*(row[k] for k in knobs), round(row["max_qps"], 2), round(row["qps_per_dollar"], 3)]
         for row in sorted(searched, key=lambda r: -r["qps_per_dollar"])[:5]],
    )  # fmt: skip
    print(
        f"{len(rows)} configurations ({len(rows) - len(searched)} skipped: do not fit), {simulations} simulations"
    )
    results.goal("configurations searched", len(searched), ">=", MIN_CONFIGURATIONS)
    results.goal(
        f"search wall time, {len(searched)} configurations, {args.workers} workers (s)",
        wall,
        "<",
        MAX_WALL_S,
        headline=True,
    )
    results.goal(
        "configurations searched that found no rate meeting the SLOs",
        sum(not r["max_qps"] for r in searched),
        "==",
        0,
    )
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
