"""Joining a Ray cluster, for `sim search --backend ray` and `launch` with `backend: ray`.

`ray.init(address=...)` keeps retrying an address where no cluster listens, printing nothing for
a minute and more, and a SIGTERM meanwhile waits for the retries to end (ray's handler runs only
when its C++ connect loop returns). One TCP connect to the cluster's address first answers within
seconds; a cluster that is not there is a one-line error saying what was tried and what to do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

from rollflow.errors import UserError

CONNECT_TIMEOUT_S = 5.0


def init_ray(address: str | None, address_key: str, instead: str, **init_kwargs: Any) -> None:
    """`ray.init` on the cluster at `address` (RAY_ADDRESS wins over None or "auto", as in Ray;
    None with no RAY_ADDRESS starts a cluster on this machine). `address_key` names where the user
    set the address, `instead` how to run without Ray, both for the error message."""
    import ray
    from ray._private.services import canonicalize_bootstrap_address_or_die

    if os.environ.get("RAY_ADDRESS") and address in (None, "auto"):
        address, address_key = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if address is None:
        ray.init(**init_kwargs)
        return
    try:
        # where ray.init would connect: "auto" is the last `ray start` here (or a running GCS), and
        # localhost the machine's address unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
        given = address.removeprefix("ray://")
        targets = (
            [given] if address.startswith("ray://") else [canonicalize_bootstrap_address_or_die(address)]
        )
    except (ConnectionError, ValueError):
        raise UserError(
            f"no running Ray cluster found ({address_key}: {address}); start one with `ray start --head`, "
            f"or {instead}"
        ) from None
    if given != "auto" and given not in targets:
        targets.insert(0, given)
    reason = _unreachable(targets)
    if reason is not None:
        port = targets[0].rpartition(":")[2]
        raise UserError(
            f"no Ray cluster answers at {' or '.join(targets)} ({address_key}: {address}): {reason}; "
            f"start one there with `ray start --head --port={port}`, or {instead}"
        )
    with _signals_end_the_wait(f"connecting to the Ray cluster at {address}"):
        ray.init(address=address, **init_kwargs)


@contextlib.contextmanager
def _signals_end_the_wait(what: str) -> Iterator[None]:
    """While `ray.init` waits in its C++ connect loop (an address that takes connections but
    answers nothing), no Python signal handler runs, its own included. The signal's byte still
    reaches the wakeup fd: a thread reading it ends the process at once (nothing is started yet)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd)

    def watch() -> None:
        while data := os.read(read_fd, 64):
            for signum in (signal.SIGTERM, signal.SIGINT):
                if signum in data:
                    sys.stderr.write(f"rollflow: stopped by {signal.Signals(signum).name} while {what}\n")
                    sys.stderr.flush()
                    os._exit(128 + signum)

    watcher = threading.Thread(target=watch, name="ray-init-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # the watcher reads the end of the pipe and returns
        watcher.join()
        os.close(read_fd)


def _unreachable(targets: list[str]) -> str | None:
    """None when one of the `host:port` targets takes a TCP connection, else why the last did not."""
    reason = None
    for target in targets:
        host, _, port = target.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
            return None
        except (OSError, ValueError) as exc:
            errno = getattr(exc, "errno", None)
            reason = os.strerror(errno).lower() if errno else str(exc) or "timed out"
    return reason
