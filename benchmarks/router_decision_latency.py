"""Decision latency of the learned router against the heuristic routers, on the same snapshots.

    python benchmarks/router_decision_latency.py examples/router/heterogeneous.policy.npz

Needs only numpy and rollflow.policy (what a live manager has). Snapshots are synthetic but
shaped like a loaded cluster (random queues, tokens, KV use, throughput per instance); each
router picks for every snapshot, many times over, and the per-call wall time is reported
(median, mean, p99) with the ratio to least_tokens, the cheapest load-aware heuristic.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rollflow.policy.learned import load_learned_router
from rollflow.policy.routing import make_router
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest


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


def time_router(router, cases, repeats: int) -> np.ndarray:
    for request, view in cases[:100]:  # warm-up
        router.pick(request, view)
    times = []
    for _ in range(repeats):
        for request, view in cases:
            start = time.perf_counter_ns()
            router.pick(request, view)
            times.append(time.perf_counter_ns() - start)
    return np.array(times) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("policy", help="exported policy file (.npz)")
    parser.add_argument("--snapshots", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    learned = load_learned_router(args.policy)
    cases = snapshots(learned.spec.num_instances, args.snapshots)
    rows = {
        name: time_router(make_router(name), cases, args.repeats) for name in ("round_robin", "least_tokens")
    }
    rows["learned"] = time_router(learned, cases, args.repeats)
    base = np.median(rows["least_tokens"])
    print(f"{learned.spec.num_instances} instances, {len(cases) * args.repeats} decisions per router")
    print(f"{'router':<14}{'median us':>10}{'mean us':>10}{'p99 us':>10}{'x least_tokens':>16}")
    for name, us in rows.items():
        print(
            f"{name:<14}{np.median(us):>10.2f}{us.mean():>10.2f}{np.percentile(us, 99):>10.2f}{np.median(us) / base:>16.2f}"
        )


if __name__ == "__main__":
    main()
