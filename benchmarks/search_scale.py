"""Time `rollflow sim search` on a large space: Llama-3-8B on A100 and H100, 144 configurations.

    python benchmarks/search_scale.py [--workers 2] [--num-requests 1000]

Runs the search from scratch (`--resume never`) through the CLI, as a user would, then prints
the wall time, the number of configurations and simulations, and the five best configurations
by capacity per dollar. The issue's goal: at least 100 configurations in under 10 minutes on a
2-core machine (the Vidur paper reports about an hour of CPU for its LLaMA2-70B search).
Measured: 1,393 simulations in 572 s. With 1,000 requests the largest configurations take a
whole run as one burst, so their max QPS is burst capacity; raise --num-requests for sustained.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def space_config(output_dir: Path, workers: int, num_requests: int) -> dict:
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
                    "file": str(REPO.parent / "shared/data/vidur/processed_traces/splitwise_conv.csv"),
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--output-dir", default=str(REPO / "outputs/bench/search_scale"))
    args = parser.parse_args()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "search.yaml"
    config.write_text(yaml.safe_dump(space_config(out, args.workers, args.num_requests)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "rollflow.cli", "sim", "search", "--config", str(config), "--resume", "never"],
        cwd=REPO,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - started
    rows = json.loads((out / "results.json").read_text())
    simulations = sum(r["simulations"] for r in rows)
    skipped = sum(1 for r in rows if r["skipped"])
    print(f"{len(rows)} configurations ({skipped} skipped: do not fit), {simulations} simulations")
    print(f"wall time {wall:.1f} s with {args.workers} workers; {simulations / wall:.1f} simulations/s")
    print("best by QPS per $/hour:")
    for row in sorted(rows, key=lambda r: -r["qps_per_dollar"])[:5]:
        knobs = " ".join(
            f"{k}={row[k]}"
            for k in ("device", "tensor_parallel", "replicas", "scheduler", "chunk_size", "batch_size_cap")
        )
        print(f"  {knobs}: {row['max_qps']:.2f} QPS, {row['qps_per_dollar']:.3f} QPS per $/h")


if __name__ == "__main__":
    main()
