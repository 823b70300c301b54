"""Cache-affine routers: keep what shares a prefix on the instance that caches it.

- `prefix_affinity`: a request goes to the instance caching the largest share of its prompt
  (the view's `cached_tokens`), or where its prefix key (its GRPO group, its session) was last
  sent, unless that instance is overloaded; otherwise to the least loaded instance. This is
  sgl-router's `cache_aware` rule with its thresholds (`balance_abs_threshold`,
  `balance_rel_threshold`, `cache_threshold`), except that overload is judged for the chosen
  instance, not the whole cluster: a cold instance elsewhere does not break every affinity.
- `session`: sticky-least-loaded (prime-rl's and SkyRL's default): a key's first request goes to
  the least loaded instance and the rest follow it while it is not overloaded.
- `consistent_hash`: a hash ring over the instances keyed by the prefix key, as the thrash
  baseline: it never looks at load.

All read the world only through the view; the records they keep (key -> instance last sent)
are their own decisions, which a manager has as well.
"""

from __future__ import annotations

from bisect import bisect
from collections import OrderedDict

from rollflow.policy.view import ClusterView, InstanceView, RouteRequest

MAX_REMEMBERED_KEYS = 65536  # prefix keys whose last instance a router remembers (oldest forgotten)
VIRTUAL_NODES = 64  # ring points per instance (consistent_hash)


def _load(instance: InstanceView) -> int:
    return instance.num_outstanding


def _least_loaded(view: ClusterView) -> InstanceView:
    return min(view.instances, key=lambda i: (_load(i), i.token_load, i.instance_id))


class _KeyRecord:
    """Bounded map prefix key -> instance id of the last request sent with that key."""

    def __init__(self) -> None:
        self._last: OrderedDict[int, int] = OrderedDict()

    def get(self, key: int) -> int | None:
        return self._last.get(key) if key else None

    def forget(self, key: int) -> None:
        self._last.pop(key, None)

    def put(self, key: int, instance_id: int) -> None:
        if not key:
            return
        last = self._last
        last[key] = instance_id
        last.move_to_end(key)
        if len(last) > MAX_REMEMBERED_KEYS:
            last.popitem(last=False)


class _Balanced:
    """The overload rule shared by the affine routers."""

    def __init__(
        self,
        seed: int = 0,
        balance_abs_threshold: int = 16,
        balance_rel_threshold: float = 1.5,
        cache_threshold: float = 0.3,
    ) -> None:
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.cache_threshold = cache_threshold
        self.record = _KeyRecord()

    def overloaded(self, instance: InstanceView, least: InstanceView) -> bool:
        """More outstanding requests than the least loaded by both thresholds."""
        load, low = _load(instance), _load(least)
        return load - low > self.balance_abs_threshold and load > self.balance_rel_threshold * low


class PrefixAffinityRouter(_Balanced):
    name = "prefix_affinity"
    reads_cache = True  # the simulator fills `InstanceView.cached_tokens` for it

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        least = _least_loaded(view)
        prompt = max(1, request.prompt_tokens)
        recorded = self.record.get(request.prefix_key)

        def score(instance: InstanceView) -> tuple[float, int, int, int]:
            # the key's own instance counts as fully cached (what was sent there may still be
            # queued); equal matches (a system prompt cached everywhere) go to the least loaded
            share = 1.0 if instance.instance_id == recorded else instance.cached_tokens / prompt
            return (share, -_load(instance), -instance.token_load, -instance.instance_id)

        best = max(view.instances, key=score)
        if score(best)[0] < self.cache_threshold or self.overloaded(best, least):
            best = least
        self.record.put(request.prefix_key, best.instance_id)
        return best.instance_id


class SessionRouter(_Balanced):
    name = "session"

    def end(self, key: int) -> None:
        """A session (its prefix key) is over: its instance is no longer kept for it."""
        self.record.forget(key)

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        least = _least_loaded(view)
        recorded = self.record.get(request.prefix_key)
        chosen = least
        for instance in view.instances:
            if instance.instance_id == recorded and not self.overloaded(instance, least):
                chosen = instance
                break
        self.record.put(request.prefix_key, chosen.instance_id)
        return chosen.instance_id


class ConsistentHashRouter:
    name = "consistent_hash"

    def __init__(self, seed: int = 0, **_thresholds: object) -> None:
        self._members: tuple[int, ...] = ()
        self._points: list[int] = []
        self._owners: list[int] = []

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        members = tuple(i.instance_id for i in view.instances)
        if members != self._members:
            ring = sorted(
                (_mix(member * VIRTUAL_NODES + v), member) for member in members for v in range(VIRTUAL_NODES)
            )
            self._members = members
            self._points = [point for point, _ in ring]
            self._owners = [owner for _, owner in ring]
        key = request.prefix_key or -1 - request.request_id
        index = bisect(self._points, _mix(key)) % len(self._points)
        return self._owners[index]


def _mix(value: int) -> int:
    """A 64-bit integer hash (splitmix64's finaliser): deterministic across processes."""
    value = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return value ^ (value >> 31)
