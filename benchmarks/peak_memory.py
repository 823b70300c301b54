"""Peak memory of a 100,000-request serving simulation, every output on (goal: under 1 GiB).

    .venv/bin/python benchmarks/peak_memory.py
    .venv/bin/python benchmarks/peak_memory.py --quick    # 20,000 requests

`rollflow sim serve` on examples/sim/demo.yaml with 16 replicas at 40 QPS (least-tokens routing,
requests.csv, chrome trace and plots written), as a child process whose peak resident set size
the kernel reports (`wait4`'s ru_maxrss), so the figure is the whole process's, imports included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, benchmark_parser, results_dir

REPO = Path(__file__).resolve().parents[1]
MAX_PEAK_MIB = 1024.0


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--requests", type=int, default=None, help="default 100,000 (--quick: 20,000)")
    args = parser.parse_args()
    requests = args.requests or (20_000 if args.quick else 100_000)
    results = Results("peak_memory", results_dir(args))
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, "-m", "rollflow.cli", "sim", "serve", "--config", str(REPO / "examples/sim/demo.yaml"),
            "--output-dir", out, f"workload.num_requests={requests}", "cluster.replicas=16",
            "workload.intervals.qps=40",
        ]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status):
            sys.exit(f"simulation failed: {' '.join(cmd)}\n{proc.stderr.read()[-2000:]}")
        summary = json.loads((Path(out) / "summary.json").read_text())
    peak_mib = usage.ru_maxrss / 1024
    results.figures.update(
        {"requests": requests, "simulated_s": summary["simulated_time_s"], "wall_s": wall,
         "sim_loop_s": summary["sim_loop_s"], "peak_rss_mib": peak_mib}
    )  # fmt: skip
    results.table(
        "Peak memory, every output written",
        ["requests", "simulated (s)", "wall (s)", "simulation loop (s)", "peak memory (MiB)"],
        [[summary["num_requests"], round(summary["simulated_time_s"]), round(wall, 2),
          round(summary["sim_loop_s"], 2), round(peak_mib)]],
    )  # fmt: skip
    results.goal(f"peak memory, {requests:,} requests (MiB)", peak_mib, "<", MAX_PEAK_MIB, headline=True)
    results.goal("requests not completed", requests - summary["num_completed"], "==", 0)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
