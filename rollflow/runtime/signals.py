"""SIGTERM takes Ctrl-C's way out of a rollflow server.

systemd, Kubernetes, torchrun and `rollflow launch` stop a process with SIGTERM, whose default
action ends it on the spot: the manager would then skip its close (the journal's last batched
writes, the request log's tail, the engines' in-flight requests) and the built-in engine its
worker's stop. As a KeyboardInterrupt, SIGTERM unwinds `asyncio.run` like Ctrl-C: every task is
cancelled, every `finally` runs, and the CLI exits 130 with "rollflow: interrupted".

A server's loop takes SIGTERM itself (`run_until_sigterm`): a KeyboardInterrupt raised at whatever
bytecode the signal lands on can cut a loop callback in half (a connection's bookkeeping, a future
another task waits for), and the close that follows may then wait on what will never come.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises KeyboardInterrupt in the main thread (call it from there)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


async def until_sigterm(main: Coroutine[Any, Any, None]) -> bool:
    """Run `main` until it returns or SIGTERM comes; True when SIGTERM stopped it (the caller then
    raises KeyboardInterrupt, outside the loop).

    The loop itself takes the signal and, between two callbacks, cancels every task as
    `asyncio.run` does on its way out of a KeyboardInterrupt: request handlers end at once and
    every `finally` of `main` runs, as for Ctrl-C. (uvloop's transports, besides, take an exception
    raised inside their callbacks as their own fatal error and carry on.)
    """
    loop = asyncio.get_running_loop()
    task = loop.create_task(main)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:  # a second SIGTERM must not cut the close short
            stopped = True
            for running in asyncio.all_tasks(loop):
                running.cancel()

    loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        await task
    except asyncio.CancelledError:
        if not stopped:
            raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    return stopped


def run_until_sigterm(
    main: Callable[[], Coroutine[Any, Any, None]],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> None:
    """Run a server's `main()` on a new loop (`loop_factory`'s, asyncio's by default) until it
    returns or SIGTERM stops it; then KeyboardInterrupt, the CLI's way out of a stop ("rollflow:
    interrupted", exit 130). Before the loop runs, SIGTERM is already a KeyboardInterrupt."""
    stop_on_sigterm()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        if runner.run(until_sigterm(main())):
            raise KeyboardInterrupt
