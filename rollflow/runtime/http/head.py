"""Header values out of a raw HTTP/1.1 head, for the two hand-written protocols on the hot path
(the engine client's pool and the manager's lean `/generate`): aiohttp's parser is what they
avoid, so they read the few fields they need themselves."""

from __future__ import annotations


def header_value(fields: bytes, name: bytes) -> bytes | None:
    """The value of header `name` (lower case) in a lower-cased head whose lines each start with
    CRLF; None when the head has no such line."""
    start = fields.find(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    end = fields.find(b"\r\n", start)
    return fields[start : end if end >= 0 else len(fields)].strip()
