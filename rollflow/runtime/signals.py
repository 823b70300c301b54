"""SIGTERM takes Ctrl-C's way out of a rollflow server.

systemd, Kubernetes, torchrun and `rollflow launch` stop a process with SIGTERM, whose default
action ends it on the spot: the manager would then skip its close (the journal's last batched
writes, the request log's tail, the engines' in-flight requests) and the built-in engine its
worker's stop. As a KeyboardInterrupt, SIGTERM unwinds `asyncio.run` like Ctrl-C: every task is
cancelled, every `finally` runs, and the CLI exits 130 with "rollflow: interrupted".
"""

from __future__ import annotations

import signal


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises KeyboardInterrupt in the main thread (call it from there)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
