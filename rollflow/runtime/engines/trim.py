"""An SGLang event's JSON without the output tokens the reader has seen (sglang.py's EventReducer).

SGLang's default events each repeat the whole output so far, in `output_ids` and in
`meta_info.output_token_logprobs`: parsing all of it per read cost the manager time in proportion to
the output's length, per token (a 256-token answer read 8 events at a time parses each token 16
times over). The reader knows how many tokens it has seen, so `trim_event` cuts those from the
front of both lists, in one pass over the bytes, and the reader parses only the rest.

`trim_event` is the C extension `rollflow.runtime.engines._trim` where it is built, else
`trim_event_py`, the reference it is tested against (the same answers, byte for byte).
"""

from __future__ import annotations

from collections.abc import Callable

WHITESPACE = b" \t\n\r"
ESCAPES = b'"\\/bfnrt'
HEX = b"0123456789abcdefABCDEF"
DIGITS = b"0123456789"
ENDS = b",}]" + WHITESPACE  # what ends a value at the top of `_value_end`'s walk
MAX_DEPTH = 512


def trim_event_py(data: bytes | memoryview, drop: int) -> bytes | None:
    """`data` (one event's JSON) without the first `drop` elements of `output_ids` and of
    `meta_info.output_token_logprobs`, or None when it cannot be cut so (the caller parses it whole).

    It is cut when it is an object with the key "output_ids" once, holding a list, and "meta_info"
    once, holding an object with "output_token_logprobs" once, holding a list (keys spelled without
    escapes), and both lists hold at least `drop` elements, the first `drop` of which are, in
    `output_ids`, numbers and, in `output_token_logprobs`, lists of scalars (numbers, strings, true,
    false, null), all in printable ASCII. Only the dropped elements are checked to be JSON: the
    caller's parse checks the rest. None for drop <= 0."""
    t = bytes(data)
    i = _ws(t, 0)
    if drop <= 0 or i >= len(t) or t[i] != ord("{"):
        return None
    cuts: dict[str, tuple[int, int]] = {}  # "ids" and "entries": the bytes cut from each list
    end = _walk_object(t, i, drop, True, cuts, set())
    if end < 0 or _ws(t, end) != len(t) or set(cuts) != {"ids", "entries"}:
        return None
    (a, b), (c, d) = sorted(cuts.values())
    return t[:a] + t[b:c] + t[d:]


def _ws(t: bytes, i: int) -> int:
    while i < len(t) and t[i] in WHITESPACE:
        i += 1
    return i


def _string_end(t: bytes, i: int, strict: bool) -> int:
    i += 1
    while i < len(t):
        c = t[i]
        if c == ord('"'):
            return i + 1
        if strict and (c < 0x20 or c >= 0x80):
            return -1
        if c == ord("\\"):
            if i + 1 >= len(t):
                return -1
            e = t[i + 1]
            if not strict:
                i += 2
                continue
            if e == ord("u"):
                if i + 5 >= len(t) or any(h not in HEX for h in t[i + 2 : i + 6]):
                    return -1
                i += 6
                continue
            if e not in ESCAPES:
                return -1
            i += 2
            continue
        i += 1
    return -1


def _digits(t: bytes, i: int) -> int:
    while i < len(t) and t[i] in DIGITS:
        i += 1
    return i


def _number_end(t: bytes, i: int) -> int:
    if i < len(t) and t[i] == ord("-"):
        i += 1
    if i >= len(t):
        return -1
    if t[i] == ord("0"):
        i += 1
    elif ord("1") <= t[i] <= ord("9"):
        i = _digits(t, i)
    else:
        return -1
    if i < len(t) and t[i] == ord("."):
        i += 1
        if i >= len(t) or t[i] not in DIGITS:
            return -1
        i = _digits(t, i)
    if i < len(t) and t[i] in b"eE":
        i += 1
        if i < len(t) and t[i] in b"+-":
            i += 1
        if i >= len(t) or t[i] not in DIGITS:
            return -1
        i = _digits(t, i)
    return i


def _scalar_end(t: bytes, i: int) -> int:
    if i >= len(t):
        return -1
    c = t[i]
    if c == ord('"'):
        return _string_end(t, i, True)
    for word in (b"true", b"false", b"null"):
        if c == word[0]:
            return i + len(word) if t.startswith(word, i) else -1
    return _number_end(t, i)


def _list_rest(t: bytes, i: int, element_end: Callable[[bytes, int], int]) -> int:
    """From the element at i to the end of its list, each element's end found by `element_end` and
    followed by a comma or the closing bracket: the list's end, or -1."""
    while True:
        i = element_end(t, i)
        if i < 0:
            return -1
        i = _ws(t, i)
        if i >= len(t):
            return -1
        if t[i] == ord("]"):
            return i + 1
        if t[i] != ord(","):
            return -1
        i = _ws(t, i + 1)


def _scalar_list_end(t: bytes, i: int) -> int:
    i = _ws(t, i + 1)
    if i < len(t) and t[i] == ord("]"):
        return i + 1
    return _list_rest(t, i, _scalar_end)


def _value_end(t: bytes, i: int) -> int:
    """The end of any value at i, unchecked but for its brackets and strings; -1 if they do not close."""
    stack: list[int] = []
    if i >= len(t):
        return -1
    while True:
        c = t[i]
        if c == ord('"'):
            i = _string_end(t, i, False)
            if i < 0:
                return -1
        else:
            if c in b"[{":
                if len(stack) == MAX_DEPTH:
                    return -1
                stack.append(ord("]") if c == ord("[") else ord("}"))
            elif c in b"]}":
                if not stack or stack[-1] != c:
                    return -1
                stack.pop()
            elif not stack and c in b"," + WHITESPACE:
                return i
            i += 1
        if not (i < len(t) and (stack or t[i] not in ENDS)):
            break
    return -1 if stack else i


def _trim_list(t: bytes, i: int, drop: int, numbers: bool, cuts: dict, name: str) -> int:
    """The list at t[i] == "[": the bytes of its first `drop` elements (numbers, else lists of
    scalars) go to `cuts[name]`; the list's end, or -1."""
    start = j = _ws(t, i + 1)
    for k in range(drop):
        if j >= len(t):
            return -1
        if numbers:
            j = _number_end(t, j)
        elif t[j] == ord("["):
            j = _scalar_list_end(t, j)
        else:
            return -1
        if j < 0:
            return -1
        j = _ws(t, j)
        if j >= len(t):
            return -1
        if t[j] == ord(","):
            j = _ws(t, j + 1)
        elif t[j] == ord("]"):
            if k + 1 < drop:
                return -1  # fewer elements than `drop`
            cuts[name] = (start, j)
            return j + 1
        else:
            return -1
    cuts[name] = (start, j)
    if j < len(t) and t[j] == ord("]"):
        return -1  # a comma before the end: not JSON
    return _list_rest(t, j, _value_end)  # the rest of the list, as it is


def _walk_object(t: bytes, i: int, drop: int, top: bool, cuts: dict, seen: set[str]) -> int:
    """The object at t[i] == "{", its keys walked: at the top "output_ids" and "meta_info" are looked
    for, in meta_info "output_token_logprobs". Its end, or -1 (a key seen twice, or one with an
    escape, included)."""
    i = _ws(t, i + 1)
    if i < len(t) and t[i] == ord("}"):
        return i + 1
    while True:
        if i >= len(t) or t[i] != ord('"'):
            return -1
        key_end = _string_end(t, i, False)
        if key_end < 0 or b"\\" in t[i:key_end]:
            return -1
        key = t[i + 1 : key_end - 1]
        j = _ws(t, key_end)
        if j >= len(t) or t[j] != ord(":"):
            return -1
        j = _ws(t, j + 1)
        if j >= len(t):
            return -1
        if top and key == b"output_ids":
            if "ids" in cuts or t[j] != ord("["):
                return -1
            j = _trim_list(t, j, drop, True, cuts, "ids")
        elif top and key == b"meta_info":
            if "meta_info" in seen or t[j] != ord("{"):
                return -1
            seen.add("meta_info")
            j = _walk_object(t, j, drop, False, cuts, seen)
        elif not top and key == b"output_token_logprobs":
            if "entries" in cuts or t[j] != ord("["):
                return -1
            j = _trim_list(t, j, drop, False, cuts, "entries")
        else:
            j = _value_end(t, j)
        if j < 0:
            return -1
        j = _ws(t, j)
        if j >= len(t):
            return -1
        if t[j] == ord("}"):
            return j + 1
        if t[j] != ord(","):
            return -1
        i = _ws(t, j + 1)


try:
    from rollflow.runtime.engines._trim import trim_event
except ImportError:  # no C compiler at install time: the reference, slower
    trim_event = trim_event_py
