"""The Ray backend: each launched process runs inside one Ray actor, on a node Ray picks by the
actor's resources and node-label selector (spot pools ask for nodes labelled preemptible).

The actor owns its process: the process dies with the actor's worker (PR_SET_PDEATHSIG), so a
node that is lost or an actor that is killed is a process that exited, and the launcher
deregisters the engine from the manager as a preempted one.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from rollflow.runtime.launch.process import LaunchError
from rollflow.runtime.launch.slots import LocalSlot

# what `exit_code` reports for a slot whose actor or node is gone
LOST_EXIT_CODE = -9
_CALL_TIMEOUT_S = 60.0
# how often a pending actor is looked at while it waits for a node
_PLACEMENT_POLL_S = 5.0


class _ProcessActor:
    """Runs one process on its node through a LocalSlot bound to the node's address."""

    def __init__(self, name: str) -> None:
        self.slot = LocalSlot(name)
        self.slot.host = ray.util.get_node_ip_address()

    def host(self) -> str:
        return self.slot.host

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        return self.slot.free_port()

    def pull_weights(self, weights_url: str, tokenizer_dir: str, out_dir: str) -> int:
        return self.slot.pull_weights(weights_url, tokenizer_dir, out_dir)

    def start(
        self, argv: list[str], log_path: str, env: dict[str, str], rollflow: bool, files: dict[str, str]
    ) -> None:
        self.slot.start(argv, log_path, env, rollflow, files)

    def exit_code(self) -> int | None:
        return self.slot.exit_code()

    def log_tail(self) -> str:
        return self.slot.log_tail()

    def stop(self) -> None:
        self.slot.stop()


_RemoteProcessActor = ray.remote(_ProcessActor)


def _asked(options: dict[str, Any]) -> dict[str, float]:
    return {"CPU": options.get("num_cpus", 0.0), **options.get("resources", {})}


def is_short(options: dict[str, Any], available: dict[str, float]) -> bool:
    """Whether the cluster lacks free room for an actor with these `options` (a per-cluster sum: a
    resource split over nodes may still leave no single node with enough)."""
    return any(available.get(name, 0.0) < amount for name, amount in _asked(options).items() if amount > 0)


def shortfall(options: dict[str, Any], available: dict[str, float], total: dict[str, float]) -> str:
    """Why an actor with these `options` may find no node: each resource it asks for against what the
    cluster has free and in all (per cluster, so a resource split over nodes can still fall short)."""
    parts = []
    for resource, amount in _asked(options).items():
        if amount <= 0:
            continue
        free, held = available.get(resource, 0.0), total.get(resource, 0.0)
        short = " (short)" if free < amount else ""
        parts.append(f"{resource}: asked {amount:g}, {free:g} free of {held:g}{short}")
    selector = options.get("label_selector")
    if selector:
        parts.append(f"node labels {selector} (nodes need them)")
    hint = "; free resources by stopping other actors or start Ray with more (ray start --num-cpus N)"
    return "; ".join(parts) + hint


class RaySlot:
    def __init__(self, name: str, options: dict[str, Any], start_timeout_s: float) -> None:
        self.name = name
        self.actor = _RemoteProcessActor.options(**options).remote(name)
        self.host = self._await_start(options, start_timeout_s)
        self.node_id: str = self._call("node_id")

    def _await_start(self, options: dict[str, Any], start_timeout_s: float) -> str:
        """The actor's node address once it runs. An actor no node has room for fails after
        `_CALL_TIMEOUT_S`, naming what is short; one that has room may take up to `start_timeout_s`,
        since a busy node starts a Python worker slowly (a minute and more on 2 loaded cores)."""
        started = time.monotonic()
        pending = self.actor.host.remote()
        while True:
            try:
                return ray.get(pending, timeout=_PLACEMENT_POLL_S)
            except GetTimeoutError:
                waited = time.monotonic() - started
                available = ray.available_resources()
                limit = _CALL_TIMEOUT_S if is_short(options, available) else start_timeout_s
                if waited < limit:
                    continue
                ray.kill(self.actor)
                raise LaunchError(
                    f"{self.name}: no Ray node took its actor within {waited:.0f}s: "
                    f"{shortfall(options, available, ray.cluster_resources())}"
                ) from None

    def _call(self, method: str, *args):
        return ray.get(getattr(self.actor, method).remote(*args), timeout=_CALL_TIMEOUT_S)

    def free_port(self) -> int:
        return self._call("free_port")

    def pull_weights(self, weights_url: str, tokenizer_dir: str, out_dir: str) -> int:
        return self._call("pull_weights", weights_url, tokenizer_dir, out_dir)

    def start(
        self, argv: list[str], log_path: str, env: dict[str, str], rollflow: bool, files: dict[str, str]
    ) -> None:
        self._call("start", argv, log_path, env, rollflow, files)

    def exit_code(self) -> int | None:
        try:
            return self._call("exit_code")
        except RayError:
            return LOST_EXIT_CODE

    def log_tail(self) -> str:
        try:
            return self._call("log_tail")
        except RayError as exc:
            return f"(the actor is gone: {type(exc).__name__})"

    def kill(self) -> None:
        """The actor's death takes its process with it (PR_SET_PDEATHSIG), as a lost node would."""
        ray.kill(self.actor)

    def stop(self) -> None:
        with contextlib.suppress(RayError):
            self._call("stop")
        ray.kill(self.actor)
