"""Which weight version generated each response token, as the live manager records it per span.

Version v is the weights after v training steps; it reaches rollout when step v-1's sync ends
(`sync_ends[v-1]`; version 0 from the start). Step j trains with version j, so a token made on
version v is `j - v` versions stale. A sample's tokens are spread evenly over its decode window
(first token to completion): decode makes one token per iteration, and its iterations are about
equally long within one batch; a sync inside the window splits its tokens at that time.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence

from rollflow.sim.request import SimRequest


def version_at(sync_ends: Sequence[float], time: float) -> int:
    """The newest weight version rollout holds at `time` (a sync ending then counts)."""
    return bisect_right(sync_ends, time)


def spread_versions(first: float, end: float, total: int, sync_ends: Sequence[float]) -> dict[int, int]:
    """`total` tokens made evenly from `first` to `end`, per weight version (a sync splits them)."""
    if total <= 0:
        return {}
    counts: dict[int, int] = {}
    done, since = 0, first
    for boundary in sync_ends:
        if first < boundary < end:
            upto = round(total * (boundary - first) / (end - first))
            if upto > done:
                version = version_at(sync_ends, since)
                counts[version] = counts.get(version, 0) + upto - done
                done = upto
            since = boundary
    if total > done or not counts:
        version = version_at(sync_ends, since)
        counts[version] = counts.get(version, 0) + total - done
    return counts


def merge_versions(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    return {v: a.get(v, 0) + b.get(v, 0) for v in sorted(a.keys() | b.keys())}


def sample_versions(
    request: SimRequest, sync_ends: Sequence[float], earlier: dict[int, int] | None = None
) -> dict[int, int]:
    """Response tokens of one finished sample per weight version; `earlier`: those it made in
    earlier steps (partial rollout), the rest spread over this step's decode window."""
    end = request.completed_at
    assert end is not None, f"sample {request.id} has not finished"
    first = request.prefill_completed_at if request.prefill_completed_at is not None else end
    earlier = earlier or {}
    return merge_versions(
        earlier, spread_versions(first, end, request.output_tokens - sum(earlier.values()), sync_ends)
    )


def tokens_by_staleness(
    requests: Sequence[SimRequest],
    step_index: int,
    sync_ends: Sequence[float],
    earlier: Mapping[int, dict[int, int]] | None = None,
) -> tuple[dict[int, int], int]:
    """Response tokens the step trains per staleness, and the stalest sample's staleness.
    `earlier`: by request id, the tokens carried-over samples made in earlier steps."""
    earlier = earlier or {}
    by_staleness: dict[int, int] = {}
    stalest = 0
    for request in requests:
        for version, tokens in sample_versions(request, sync_ends, earlier.get(request.id)).items():
            staleness = step_index - version
            by_staleness[staleness] = by_staleness.get(staleness, 0) + tokens
            stalest = max(stalest, staleness)
    return dict(sorted(by_staleness.items())), stalest
