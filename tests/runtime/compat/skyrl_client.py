"""SkyRL's `RemoteInferenceClient`, as SkyRL ships it (skyrl 0.3.0 from PyPI, installed unchanged
into .venv/skyrl-client by `make`), driven against a router URL: each line on stdin is a JSON list of
calls, run in order, and answered by one line of JSON: what the client returned (or, for a call marked
`"expect_error": true`, the HTTP status and message it raised) and any warning it logged meanwhile.

    python -m tests.runtime.compat.skyrl_client PROXY_URL [SERVER_URL...] < calls.jsonl

With no SERVER_URL the client is built as SkyRL builds it when only `external_proxy_url` is set
(`build_new_inference_client`): `server_urls=[PROXY_URL]`, so its control plane goes to the router too.

One thing is changed around SkyRL, not in it: on Python 3.11 pydantic refuses the `typing.TypedDict`
that skyrl/tinker/types.py uses (it asks for typing_extensions' below Python 3.12, although SkyRL
declares 3.11 supported), so `typing.TypedDict` is typing_extensions' before skyrl is imported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import typing

import aiohttp
import typing_extensions

typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]

from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (  # noqa: E402
    RemoteInferenceClient,
)


class Warnings(logging.Handler):
    """What SkyRL's client logs at WARNING or above (its `skyrl` logger does not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def call(client: RemoteInferenceClient, spec: dict) -> object:
    method = getattr(client, spec["method"])
    if not spec.get("expect_error"):
        return await method(*spec.get("args", []))
    try:
        returned = await method(*spec.get("args", []))
    except aiohttp.ClientResponseError as exc:
        return {"status": exc.status, "message": exc.message}
    raise AssertionError(f"{spec['method']} was expected to fail and returned {returned!r}")


async def run(proxy_url: str, server_urls: list[str], warnings: Warnings) -> None:
    client = RemoteInferenceClient(
        proxy_url=proxy_url, server_urls=server_urls or [proxy_url], data_parallel_size=1
    )
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            results = [await call(client, spec) for spec in json.loads(line)]
            print(json.dumps({"results": results, "warnings": warnings.messages}), flush=True)
            warnings.messages = []
    finally:
        await client.teardown()


def main() -> None:
    warnings = Warnings()
    logging.getLogger("skyrl").addHandler(warnings)
    proxy_url, *server_urls = sys.argv[1:]
    asyncio.run(run(proxy_url, server_urls, warnings))


if __name__ == "__main__":
    main()
