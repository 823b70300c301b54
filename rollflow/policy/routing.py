"""Request routers: pick the instance for one arriving request from a cluster snapshot.

Routers may keep their own decision state (a round-robin cursor, a seeded RNG) but read the
world only through the `ClusterView`, so the same object routes in the simulator and live.
Ties go to the lowest instance id, which keeps runs deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Protocol

from rollflow.errors import UserError
from rollflow.policy.affinity import ConsistentHashRouter, PrefixAffinityRouter, SessionRouter
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest


class Router(Protocol):
    name: str
    # Optional `reads_load = False`: `pick` reads only the instances' ids and order (no load, and
    # not the request's prefix key), so the simulator and the manager hand it `view.id_only_view`s,
    # loads at zero (a view per instance per routed request is most of routing's cost), and the
    # manager leaves the key at 0 rather than hash the prompt. Routers without it get full views.

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        """Return the `instance_id` that should serve `request`."""
        ...


class RoundRobinRouter:
    name = "round_robin"
    reads_load = False  # ids and order only

    def __init__(self, seed: int = 0) -> None:
        self._counter = 0

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        instance = view.instances[self._counter % len(view.instances)]
        self._counter += 1
        return instance.instance_id


class RandomRouter:
    name = "random"
    reads_load = False  # ids and order only

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        return view.instances[self._rng.randrange(len(view.instances))].instance_id


class _ArgminRouter:
    """Picks the instance with the smallest `load`; subclasses name the load."""

    name = ""

    def __init__(self, seed: int = 0) -> None:
        pass

    @staticmethod
    def load(instance: InstanceView) -> float:
        raise NotImplementedError

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        return min(view.instances, key=lambda inst: (self.load(inst), inst.instance_id)).instance_id


class LeastOutstandingRequestsRouter(_ArgminRouter):
    """Vidur's `lor`: fewest requests waiting in the instance's queue (running ones not counted)."""

    name = "lor"

    @staticmethod
    def load(instance: InstanceView) -> float:
        return instance.num_queued


class LeastOutstandingRouter(_ArgminRouter):
    """Fewest requests on the instance, waiting or running."""

    name = "least_outstanding"

    @staticmethod
    def load(instance: InstanceView) -> float:
        return instance.num_outstanding


class LeastTokensRouter(_ArgminRouter):
    """Least token work left: queued requests' tokens plus running requests' remaining tokens."""

    name = "least_tokens"

    @staticmethod
    def load(instance: InstanceView) -> float:
        return instance.token_load


def _learned_router(seed: int = 0, path: str | None = None) -> Router:
    """A policy trained by `rollflow router train`, loaded from its exported file (numpy only)."""
    from rollflow.policy.learned import load_learned_router

    if path is None:
        raise UserError("router 'learned' needs the path of an exported policy (policy.npz)")
    return load_learned_router(path)


ROUTERS: dict[str, Callable[..., Router]] = {}
AFFINITY_ROUTERS: set[str] = set()  # routers built with the balance thresholds (cluster.affinity)


def register_router(name: str, factory: Callable[..., Router], takes_thresholds: bool = False) -> None:
    if name in ROUTERS:
        raise ValueError(f"router {name!r} is already registered")
    ROUTERS[name] = factory
    if takes_thresholds:
        AFFINITY_ROUTERS.add(name)


for _cls in (
    RoundRobinRouter,
    RandomRouter,
    LeastOutstandingRequestsRouter,
    LeastOutstandingRouter,
    LeastTokensRouter,
):
    register_router(_cls.name, _cls)
register_router("learned", _learned_router)
for _cls in (PrefixAffinityRouter, SessionRouter, ConsistentHashRouter):
    register_router(_cls.name, _cls, takes_thresholds=True)


def make_router(
    name: str, seed: int = 0, path: str | None = None, thresholds: Mapping[str, float] | None = None
) -> Router:
    """Build a registered router; `path` is the policy file of a router that loads one (learned),
    `thresholds` the balance thresholds of a cache-affine one (its defaults if not given)."""
    factory = ROUTERS.get(name)
    if factory is None:
        raise ValueError(f"unknown router {name!r}; choose one of: {', '.join(ROUTERS)}")
    if name in AFFINITY_ROUTERS:
        return factory(seed, **(thresholds or {}))
    return factory(seed) if path is None else factory(seed, path=path)
