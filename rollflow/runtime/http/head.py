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


def split_content_length(fields: bytes) -> tuple[bytes | None, bytes]:
    """The first Content-Length value of a lower-cased head whose lines each start with CRLF
    (unstripped; None when there is none), and the head without that line. The length is the one
    field that changes from one message to the next, so the rest of a head can be checked once per
    shape and remembered."""
    start = fields.find(b"\r\ncontent-length:")
    if start < 0:
        return None, fields
    end = fields.find(b"\r\n", start + 2)
    end = len(fields) if end < 0 else end
    return fields[start + 17 : end], fields[:start] + fields[end:]
