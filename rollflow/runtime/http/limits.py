"""How slowly a request may arrive before its connection is closed: one rule for every server (the
manager, its lean path, the built-in engine, the weight server), and the flags that set it.

A connection that has not sent a whole request head within `read_timeout_s` of connecting is
closed. A body is cut off (its connection closed) when it pauses for `read_timeout_s`, when it has
not all arrived `body_timeout_s` after its head, or when, after its first `read_timeout_s`, it has
come at fewer than `min_body_bytes_per_s` bytes a second on average since its head. The pause
alone let a client that sends one byte every few seconds hold a socket forever; the average rate
closes it after about `read_timeout_s`, and the total time bounds a body that keeps just above it.
No aiohttp here: the CLIs import this module to build their flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_BODY_TIMEOUT_S = 300.0
"""Manager and engine: a 64 MiB body in 300 s is 220 KB/s, far below any network they share."""
DEFAULT_UPLOAD_TIMEOUT_S = 3600.0
"""The weight server's: a 64 GiB upload (its default limit) in an hour is 19 MB/s."""
DEFAULT_MIN_BODY_BYTES_PER_S = 16384.0


@dataclass(frozen=True)
class BodyLimits:
    """How slowly a request may arrive before its connection is closed (the module's rule)."""

    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    """Longest wait for a whole head from a connection's start, and longest pause inside a body."""
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    """Longest time a whole body may take to arrive, from its head."""
    min_body_bytes_per_s: float = DEFAULT_MIN_BODY_BYTES_PER_S
    """Slowest average rate of a body (from its head, after its first `read_timeout_s`)."""

    def deadline(self, started: float, last: float, received: int) -> float:
        """When a body whose head came at `started`, whose last bytes came at `last` and of which
        `received` bytes came so far is cut off unless more of it comes first (loop time)."""
        return min(self._deadlines(started, last, received))

    def why(self, started: float, last: float, received: int) -> str:
        """Which limit a body broke, once its deadline passed."""
        stall, total, rate = self._deadlines(started, last, received)
        if stall <= min(total, rate):
            return f"no body bytes for {self.read_timeout_s:g}s (read_timeout_s)"
        if total <= rate:
            return f"the body did not all arrive within {self.body_timeout_s:g}s (body_timeout_s)"
        return (
            f"the body came at fewer than {self.min_body_bytes_per_s:g} bytes/s on average "
            f"({received} bytes in {rate - started:.1f}s; min_body_bytes_per_s)"
        )

    def _deadlines(self, started: float, last: float, received: int) -> tuple[float, float, float]:
        return (
            last + self.read_timeout_s,
            started + self.body_timeout_s,
            started + self.read_timeout_s + received / self.min_body_bytes_per_s,
        )


DEFAULT_LIMITS = BodyLimits()
UPLOAD_LIMITS = BodyLimits(body_timeout_s=DEFAULT_UPLOAD_TIMEOUT_S)
"""The weight server's default."""


def add_arguments(parser: argparse.ArgumentParser, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
    """`--read-timeout-s`, `--body-timeout-s` and `--min-body-bytes-per-s`, with their defaults."""
    parser.add_argument(
        "--read-timeout-s",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        help="close a connection that sends no whole request head, or pauses its body, this long "
        f"(default {DEFAULT_READ_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--body-timeout-s",
        type=float,
        default=body_timeout_s,
        help=f"close a connection whose body has not all arrived this long after its head (default {body_timeout_s:g})",
    )
    parser.add_argument(
        "--min-body-bytes-per-s",
        type=float,
        default=DEFAULT_MIN_BODY_BYTES_PER_S,
        help="close a connection whose body, after its first --read-timeout-s, has come at fewer bytes a "
        f"second on average (default {DEFAULT_MIN_BODY_BYTES_PER_S:g})",
    )


def from_arguments(args: argparse.Namespace) -> BodyLimits:
    return BodyLimits(args.read_timeout_s, args.body_timeout_s, args.min_body_bytes_per_s)
