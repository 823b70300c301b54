"""Decision latency of the learned router against the heuristic routers, on the same snapshots.

    .venv/bin/python benchmarks/router_decision_latency.py examples/router/heterogeneous.policy.npz
    .venv/bin/python benchmarks/router_decision_latency.py --quick    # 500 snapshots, 2 repeats

Needs only numpy and rollflow.policy (what a live manager has). Snapshots are synthetic but
shaped like a loaded cluster (random queues, tokens, KV use, throughput per instance); each
router picks for every snapshot, many times over, the routers taking turns per repeat, and the
per-call wall time is recorded (median, mean, p99) with the ratio to least_tokens, the cheapest
load-aware heuristic. Goal: the learned router's median decision within 50 us (4 instances for
the shipped policy). A wall-clock figure: a loaded core misses it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from rollflow.policy.learned import load_learned_router
from rollflow.policy.routing import make_router
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, benchmark_parser, results_dir

REPO = Path(__file__).resolve().parents[1]
MAX_MEDIAN_US = 50.0


def snapshots(num_instances: int, count: int, seed: int = 0) -> list[tuple[RouteRequest, ClusterView]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        instances = [
            InstanceView(
                i,
                int(rng.integers(0, 64)),
                int(rng.integers(0, 16)),
                int(rng.integers(0, 40_000)),
                int(rng.integers(0, 80_000)),
                float(rng.random()),
                float(rng.uniform(500, 8000)),
            )
            for i in range(num_instances)
        ]
        out.append(
            (
                RouteRequest(k, int(rng.integers(16, 3000)), int(rng.integers(1, 1000))),
                ClusterView(1.0, instances),
            )
        )
    return out


def time_round(router, cases) -> list[int]:
    """Nanoseconds of each `pick` over one pass of the snapshots."""
    times = []
    for request, view in cases:
        start = time.perf_counter_ns()
        router.pick(request, view)
        times.append(time.perf_counter_ns() - start)
    return times


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "policy",
        nargs="?",
        default=str(REPO / "examples/router/heterogeneous.policy.npz"),
        help="exported policy file (.npz; default the shipped heterogeneous one)",
    )
    parser.add_argument("--snapshots", type=int, default=None, help="default 2000 (--quick: 500)")
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (--quick: 2)")
    args = parser.parse_args()
    count, repeats = args.snapshots or (500 if args.quick else 2000), args.repeats or (2 if args.quick else 5)
    results = Results("router_decision_latency", results_dir(args))
    learned = load_learned_router(args.policy)
    cases = snapshots(learned.spec.num_instances, count)
    routers = {name: make_router(name) for name in ("round_robin", "least_tokens")} | {"learned": learned}
    for router in routers.values():  # warm-up
        for request, view in cases[:100]:
            router.pick(request, view)
    times: dict[str, list[int]] = {name: [] for name in routers}
    for _ in range(repeats):  # in turns, so a change in the machine's load touches every router
        for name, router in routers.items():
            times[name] += time_round(router, cases)
    us = {name: np.array(t) / 1e3 for name, t in times.items()}
    base = float(np.median(us["least_tokens"]))
    rows = []
    for name, values in us.items():
        median = float(np.median(values))
        results.figures[name] = {"median_us": median, "mean_us": float(values.mean()),
                                 "p99_us": float(np.percentile(values, 99))}  # fmt: skip
        rows.append([name, round(median, 2), round(float(values.mean()), 2),
                     round(float(np.percentile(values, 99)), 2), round(median / base, 2)])  # fmt: skip
    instances = learned.spec.num_instances
    results.figures.update({"instances": instances, "decisions_per_router": len(cases) * repeats})
    results.table(
        f"Time per decision, {instances} instances, {len(cases) * repeats:,} decisions per router",
        ["router", "median us", "mean us", "p99 us", "x least_tokens"],
        rows,
    )
    results.goal(
        f"learned router, median time per decision, {instances} instances (us)",
        results.figures["learned"]["median_us"],
        "<=",
        MAX_MEDIAN_US,
        headline=True,
    )
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
