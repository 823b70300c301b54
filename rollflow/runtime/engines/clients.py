"""Pick an engine client by the name a config or a registration uses."""

from __future__ import annotations

import aiohttp

from rollflow.errors import UserError
from rollflow.runtime.engines.base import EngineClient
from rollflow.runtime.engines.sglang import BuiltinEngineClient, SGLangClient
from rollflow.runtime.engines.vllm import VLLMClient

CLIENT_KINDS: dict[str, type[SGLangClient] | type[VLLMClient]] = {
    "builtin": BuiltinEngineClient,
    "sglang": SGLangClient,
    "vllm": VLLMClient,
}


def make_client(
    kind: str,
    url: str,
    session: aiohttp.ClientSession | None = None,
    read_timeout_s: float | None = None,
    api_key: str | None = None,
) -> EngineClient:
    """A client for the engine at `url`; it uses `session` when given (and then never closes it),
    and sends `api_key` as a bearer token on every call."""
    try:
        client_cls = CLIENT_KINDS[kind]
    except KeyError:
        raise UserError(f"unknown engine kind {kind!r}; choose one of {sorted(CLIENT_KINDS)}") from None
    return client_cls(url, session=session, read_timeout_s=read_timeout_s, api_key=api_key)
