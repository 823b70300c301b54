"""SkyRL's `RemoteInferenceClient`, as SkyRL ships it (skyrl 0.3.0 from PyPI, installed unchanged
into .venv/skyrl-client by `make`), driven against a router URL: the calls named in a JSON list on
stdin run in order, and what the client returned (and any warning it logged) is printed as JSON.

    python -m tests.runtime.compat.skyrl_client PROXY_URL SERVER_URL... < calls.json

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


async def run(proxy_url: str, server_urls: list[str], calls: list[dict]) -> dict:
    client = RemoteInferenceClient(proxy_url=proxy_url, server_urls=server_urls, data_parallel_size=1)
    results = []
    try:
        for call in calls:
            method = getattr(client, call["method"])
            results.append(await method(*call.get("args", [])))
    finally:
        await client.teardown()
    return {"results": results}


def main() -> None:
    warnings = Warnings()
    logging.getLogger("skyrl").addHandler(warnings)
    proxy_url, *server_urls = sys.argv[1:]
    answer = asyncio.run(run(proxy_url, server_urls, json.load(sys.stdin)))
    print(json.dumps(answer | {"warnings": warnings.messages}))


if __name__ == "__main__":
    main()
