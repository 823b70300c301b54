"""The wait between two flushes of a process that does nothing but read streams.

An event loop wakes whenever a socket has bytes: a stream process reading 64 engines that each
write one event per token woke about fifty times per thousand tokens, to read a few hundred bytes
and go back to sleep, and those wake-ups made its CPU per token about a fifth more than the same
reading costs inside a one-process manager (benchmarks/stream_relay.py). Yet what it reads waits
for the next flush anyway. So a process that only reads streams sleeps from one flush to the next
in one blocking poll of the few sockets that bring it other work (its manager's messages; a
relay's listening socket), and the loop then reads, once, everything each engine sent meanwhile.
It wakes about twice a flush instead. What that costs: a stream opened meanwhile starts (and an
engine's answer is read) at the end of the doze, at most one `flush_ms` later, within the bound a
token already has (reading.py).
"""

from __future__ import annotations

import select


class Doze:
    """A blocking wait on the sockets that may bring work other than engine bytes. It dozes only
    while it serves exactly one reader (`readers`): two readers' flushes, each dozing, would hold
    each other's back; a relay with several managers reads as the manager does instead."""

    def __init__(self) -> None:
        self._poll = select.poll()  # not select.select: no limit on the descriptors' numbers
        self.readers = 0

    def watch(self, fd: int) -> None:
        """Wake the doze when `fd` has something to read (a relay's listening socket)."""
        self._poll.register(fd, select.POLLIN)

    def join(self, fd: int) -> None:
        """A reader's manager connection, `fd`, which wakes the doze with each message."""
        self.watch(fd)
        self.readers += 1

    def leave(self, fd: int) -> None:
        self._poll.unregister(fd)
        self.readers -= 1

    def __call__(self, timeout_s: float) -> bool:
        """Sleep `timeout_s`, or until a watched socket has something to read; False, at once, when
        the process does not doze now (StreamReading then waits on its loop instead)."""
        if self.readers != 1:
            return False
        if timeout_s > 0:
            self._poll.poll(timeout_s * 1000.0)
        return True
