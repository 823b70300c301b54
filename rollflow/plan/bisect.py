"""Highest QPS meeting every SLO: double from a start rate until the SLOs break, then bisect.

Vidur's `capacity_search.py` bisects between 0 and 2 x start_qps and widens the upper bound by
x2 or x4 when the scheduling delay at a passing rate is far under its SLO. Here the bracket is
found by doubling alone, because several SLOs (not only scheduling delay) decide a pass, and
the stop rule is relative to the failing rate rather than to the midpoint: the answer is the
highest rate that passed, and the lowest that failed is within `tolerance` of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rollflow.plan.serve_config import BisectionConfig


@dataclass
class Probe:
    qps: float
    passed: bool
    metrics: dict[str, float]


@dataclass
class Bracket:
    """The probes of one search, in the order they ran."""

    probes: list[Probe] = field(default_factory=list)

    @property
    def best(self) -> Probe | None:
        passing = [p for p in self.probes if p.passed]
        return max(passing, key=lambda p: p.qps) if passing else None


def max_qps(probe: Callable[[float], Probe], settings: BisectionConfig) -> Bracket:
    """Run `probe` at chosen rates until the passing/failing bracket is tight; return every probe."""
    bracket = Bracket()

    def run(qps: float) -> Probe:
        result = probe(round(qps, 4))
        bracket.probes.append(result)
        return result

    low: float | None = None
    high: float | None = None
    qps = min(settings.start_qps, settings.max_qps)
    while len(bracket.probes) < settings.max_simulations:
        if run(qps).passed:
            low = qps
            if qps >= settings.max_qps:
                return bracket
            qps = min(qps * 2, settings.max_qps)
        else:
            high = qps
            if low is not None:
                break
            qps /= 2
            if qps < settings.start_qps / 1024:
                return bracket  # nothing passes even at a thousandth of the start rate
    while low is not None and high is not None and len(bracket.probes) < settings.max_simulations:
        if (high - low) / high <= settings.tolerance:
            break
        middle = (low + high) / 2
        if run(middle).passed:
            low = middle
        else:
            high = middle
    return bracket
