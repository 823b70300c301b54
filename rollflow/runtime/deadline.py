"""An await bounded in time that its caller's cancellation always ends.

Python 3.11's `asyncio.wait_for` returns a result that comes in the loop turn its caller is
cancelled, and the cancellation is lost: an attempt moved off an engine (a pause, a retirement) as
its connection opened went on waiting for that engine, and the pause waiting for it hung.
`asyncio.timeout` has no such turn (3.12 rebuilt `wait_for` on it), so rollflow bounds awaits with
this and never with `wait_for` (ruff bans it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """`await awaitable`, raising TimeoutError after `seconds` (None: no bound)."""
    async with asyncio.timeout(seconds):
        return await awaitable
