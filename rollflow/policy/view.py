"""The cluster snapshot every policy decides from, identical in simulation and at run time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

InstanceKind = Literal["local", "remote", "spot"]


class InstanceView(NamedTuple):
    """One serving instance (a replica in the simulator, an engine in the manager).

    Immutable; a NamedTuple rather than a frozen dataclass because the simulator builds one per
    instance per arrival, and tuples build several times faster.
    """

    instance_id: int
    num_running: int  # requests holding KV on the instance (prefilling or decoding)
    num_queued: int  # requests routed to it and waiting to be admitted
    queued_tokens: int  # prompt + expected output tokens of the queued requests
    running_tokens: int  # tokens the running requests still have to process
    kv_usage: float  # fraction of KV blocks in use, 0..1
    tokens_per_s: float = 0.0  # recent measured generation throughput
    kind: InstanceKind = "local"
    weight_version: int = 0
    cached_tokens: int = 0
    # prompt tokens of the request being routed that the instance is known to cache: the
    # simulator's exact prefix cache, or what a manager recorded sending there

    @property
    def num_outstanding(self) -> int:
        return self.num_running + self.num_queued

    @property
    def token_load(self) -> int:
        return self.queued_tokens + self.running_tokens


def id_only_view(instance_id: int, kind: InstanceKind) -> InstanceView:
    """An instance as a router that declares `reads_load = False` sees it (routing.Router): its id and
    kind, every load at zero. The simulator and the manager both give such routers these, so a
    policy reads the same fields in both, and neither computes loads nobody reads."""
    return InstanceView(instance_id, 0, 0, 0, 0, 0.0, 0.0, kind)


class ClusterView(NamedTuple):
    """All instances at one moment; `now` is the only clock a policy may read."""

    now: float
    instances: Sequence[InstanceView]


class RouteRequest(NamedTuple):
    """What a router knows about a request when it arrives."""

    request_id: int
    prompt_tokens: int
    expected_output_tokens: int  # the true length in simulation if so configured, else a prediction
    prefix_key: int = 0  # requests to keep together (a GRPO group, a session); 0: none
