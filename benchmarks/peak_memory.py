"""Peak memory of a 100,000-request serving simulation (goal: under 1 GiB), with every output on.

python benchmarks/peak_memory.py [--requests 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, "-m", "rollflow.cli", "sim", "serve", "--config", str(REPO / "examples/sim/demo.yaml"),
            "--output-dir", out, f"workload.num_requests={args.requests}", "cluster.replicas=16",
            "workload.intervals.qps=40",
        ]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status):
            sys.exit(f"simulation failed: {' '.join(cmd)}")
        summary = json.loads((Path(out) / "summary.json").read_text())
    peak_mib = usage.ru_maxrss / 1024
    print("| requests | simulated (s) | wall (s) | simulation loop (s) | peak memory (MiB) | vs 1 GiB goal |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {summary['num_requests']:,} | {summary['simulated_time_s']:.0f} | {wall:.1f} | {summary['sim_loop_s']:.1f} "
        f"| {peak_mib:.0f} | {peak_mib / 1024:.2f}x |"
    )


if __name__ == "__main__":
    main()
