"""A request body's bytes read as a JSON object, or a `BodyError` naming what is wrong with them.

Pure bytes in, dict out, with no server around it: body.py calls it on the event loop for small
bodies, and parse_process.py's child process calls it for big ones (so the child imports neither
aiohttp nor the server's modules).
"""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")
_DECODER = json.JSONDecoder()


class BodyError(ValueError):
    """The body is not a JSON object this server can read; the message says why."""


def parse_json_object(raw: bytes, allow_empty: bool = True) -> dict[str, Any]:
    """`raw` as a JSON object (an empty body is `{}` when `allow_empty`); a `BodyError` saying what
    is wrong when it is not UTF-8, not JSON, nested too deep, not an object, or holds a lone surrogate."""
    if not raw.strip():
        if allow_empty:
            return {}
        raise BodyError("the body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(
            f"the body is not UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 4]!r})"
        ) from None
    try:
        data = _loads(text)
    except json.JSONDecodeError as exc:
        raise BodyError(f"malformed JSON: {exc}") from None
    except RecursionError:  # the C parser stops at the interpreter's recursion limit, no deeper
        raise BodyError("JSON nested too deep (no valid request nests more than a few levels)") from None
    if not isinstance(data, dict):
        raise BodyError(f"the body must be a JSON object, not {type(data).__name__}")
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate(data, "body")
        if where is not None:
            raise BodyError(
                f"{where} holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is no character"
            )
    return data


def _loads(text: str) -> Any:
    """`json.loads(text)`, with the C scanner called at once for a document that starts at the first
    character and ends at the last (what clients send) rather than through json's Python layers
    and their whitespace regexes; anything else goes through json.loads, which reads it or raises
    in its own words."""
    try:
        data, end = _DECODER.raw_decode(text)
    except json.JSONDecodeError:
        return json.loads(text)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return json.loads(text)
    return data


def _lone_surrogate(value: Any, where: str) -> str | None:
    """Where the first string with a lone surrogate is, None when there is none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _lone_surrogate(key, f"{where} key") or _lone_surrogate(item, f"{where}.{key}")
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, f"{where}[{index}]")
            if found:
                return found
    return None
