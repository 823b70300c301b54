"""One `rollflow manager relay` per Ray node that runs engines (`launch.ray.relays`).

An engine launched on a node is registered with the relay of that node, started the first time an
engine lands there, in an actor pinned to the node: the node's tokens then reach the manager merged,
once a `manager.stream_flush_ms`, and no process parses every token of the cluster. A relay the
launch loses costs nothing but that: the manager reads the node's engines itself until it is back.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field

from rollflow.runtime.launch.ray_slots import RaySlot
from rollflow.runtime.launch.slots import wait_answering
from rollflow.runtime.manager.token import TOKEN_ENV as MANAGER_TOKEN_ENV

logger = logging.getLogger(__name__)


@dataclass
class NodeRelay:
    slot: RaySlot
    address: str  # HOST:PORT, as an engine registers it


@dataclass(eq=False)
class NodeRelays:
    """The relays of a Ray launch, one per node that runs engines: how each starts, and those started."""

    work_dir: str
    token: str | None = field(repr=False)  # the manager's secret, passed to each relay
    flush_ms: float
    start_timeout_s: float
    actor_start_timeout_s: float
    by_node: dict[str, NodeRelay] = field(default_factory=dict, init=False)

    def address_for(self, engine_slot: RaySlot) -> str:
        """The relay of the engine's node (started now if the node has none yet)."""
        relay = self.by_node.get(engine_slot.node_id)
        if relay is None:
            relay = self.by_node[engine_slot.node_id] = self._start(engine_slot.node_id)
        return relay.address

    def stop(self) -> None:
        for relay in self.by_node.values():
            relay.slot.stop()
        self.by_node.clear()

    def _start(self, node_id: str) -> NodeRelay:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = f"relay{len(self.by_node)}"
        # no CPU reserved: a relay spends a fraction of a core on what the node's engines stream
        options = {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
        slot = RaySlot(name, options, self.actor_start_timeout_s)
        try:
            port = slot.free_port()
            argv = ["manager", "relay", "--host", slot.host, "--port", str(port)]
            argv += ["--flush-ms", f"{self.flush_ms:g}", "--log-format", "json"]
            env = {MANAGER_TOKEN_ENV: self.token} if self.token else {}
            slot.start(argv, f"{self.work_dir}/{name}.log", env, rollflow=True, files={})
            wait_answering(
                slot, lambda: _listening(slot.host, port), f"{slot.host}:{port}", self.start_timeout_s
            )
        except BaseException:
            slot.stop()
            raise
        address = f"{slot.host}:{port}"
        logger.info("%s up on %s (node %s)", name, address, node_id[:12])
        return NodeRelay(slot, address)


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False
