"""Time `rollflow rl-sim search` at cluster scale: 54 plans of 256, 512 and 1,024 H100s.

    .venv/bin/python benchmarks/rl_search_scale.py [--quick] [--workers 2] [--results-dir DIR]

Runs examples/search/rl_cluster_scale.yaml through the CLI, as a user would (the whole process
timed): Llama-3-8B GRPO steps of 8,192 prompts x 16 samples (the 1,024-GPU step of
rl_step_scale.py), the collocated plan and two disaggregated actor/inference splits under static,
pipelined and dynamic scheduling, each with 8 or 32 rollout-manager relay processes. Records the
plans simulated, the wall time, the slowest plan's own time, the plans the manager held back, and
the Pareto front of throughput and cost. Goals: at least 50 plans simulated, in under 10 minutes with 2 workers, none failed. No peer
runs: the figure is rollflow's own. --quick: the 256-GPU plans only, 256 prompts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import REPO, Results, benchmark_parser, results_dir
from rollflow.plan.pareto import pareto_front
from rollflow.runtime.launch.process import rollflow_command

CONFIG = REPO / "examples" / "search" / "rl_cluster_scale.yaml"
MIN_PLANS = 50
MAX_WALL_S = 600.0
QUICK_OVERRIDES = ("space.num_gpus=[256]", "simulation.workload.num_prompts=256")


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--workers", type=int, default=2, help="processes simulating plans at once")
    args = parser.parse_args()
    results = Results("rl_search_scale", results_dir(args))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "search"
        cmd = rollflow_command("rl-sim", "search", "--config", str(CONFIG),
            "--output-dir", str(out), f"workers={args.workers}", *(QUICK_OVERRIDES if args.quick else ()),
        )  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - started
        if proc.returncode:
            sys.exit(f"rollflow rl-sim search failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        rows = json.loads((out / "results.json").read_text())
    ran = [row for row in rows if not row["skipped"]]
    points = [(row["throughput_tokens_per_s"], row["cost_usd_per_mtok"]) for row in ran]
    front = [ran[i] for i in pareto_front(points)]
    results.figures.update(
        {
            "plans": len(rows),
            "simulated": len(ran),
            "wall_s": wall,
            "workers": args.workers,
            "slowest_plan_s": max((row["seconds"] for row in ran), default=None),
            "manager_bound_plans": sum(1 for row in ran if row["manager_bound_s_per_step"] > 0),
            "num_gpus": sorted({row["num_gpus"] for row in rows}),
        }
    )
    results.table(
        "The Pareto front: throughput against $ per 1M trained tokens",
        ["GPUs", "placement", "actor", "inference", "pipelined", "scheduling", "manager processes",
         "manager-bound (s)", "step (s)", "tokens/s", "$/1M tokens"],
        [
            [r["num_gpus"], r["placement"], r["actor_gpus"], r["inference_gpus"], r["pipelining"], r["scheduling"],
             r["manager_processes"], round(r["manager_bound_s_per_step"], 1), round(r["step_time_s"], 1),
             round(r["throughput_tokens_per_s"]), round(r["cost_usd_per_mtok"], 3)]
            for r in front
        ],
    )  # fmt: skip
    print(f"{len(ran)} of {len(rows)} plans simulated in {wall:.1f} s with {args.workers} workers")
    if not args.quick:
        results.goal("plans simulated", len(ran), ">=", MIN_PLANS)
        results.goal(
            f"search wall time, {len(ran)} plans of 256-1,024 GPUs, {args.workers} workers (s)",
            wall,
            "<",
            MAX_WALL_S,
            headline=True,
        )
    results.goal("plans skipped or failed", len(rows) - len(ran), "==", 0)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
