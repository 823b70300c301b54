"""SGLang `/generate` streams reduced one read at a time (`EventReducer`): a read of many events
gives the tokens and logprobs that parsing every event would, whichever way the engine streams."""

from __future__ import annotations

import random
import re

import orjson
import pytest

from rollflow.runtime.engines.base import EngineResponseError
from rollflow.runtime.engines.sglang import EventReducer, parse_sglang_event

URL = "http://engine/generate"


def event(ids: list[int], total: int, version: int | str = 3, finish: str | None = None) -> bytes:
    """An event holding `ids` (the whole output so far, or only new ones) of `total` tokens so far."""
    meta = {
        "completion_tokens": total,
        "finish_reason": {"type": finish} if finish else None,
        "weight_version": version,
        "output_token_logprobs": [[-0.1 * t, t, None] for t in ids],
    }
    return b"data: " + orjson.dumps({"text": "", "output_ids": ids, "meta_info": meta}) + b"\n\n"


def cumulative(n: int, **kwargs) -> list[bytes]:
    return [event(list(range(1, end + 1)), end, **kwargs) for end in range(1, n + 1)]


def incremental(n: int, **kwargs) -> list[bytes]:
    return [event([end], end, **kwargs) for end in range(1, n + 1)]


def one_by_one(events: list[bytes]) -> list[tuple[list[int], list[float], int | None]]:
    """What parsing each event on its own gives: (tokens, logprobs, version) per event."""
    seen, out = 0, []
    for raw in events:
        chunk = parse_sglang_event(orjson.loads(raw[6:]), seen)
        seen += len(chunk.token_ids)
        out.append((chunk.token_ids, chunk.logprobs, chunk.weight_version))
    return out


def tokens(chunks) -> tuple[list[int], list[float]]:
    return [t for c in chunks for t in c.token_ids], [lp for c in chunks for lp in c.logprobs]


@pytest.mark.parametrize("shape", [cumulative, incremental])
@pytest.mark.parametrize("per_read", [1, 3, 40])
def test_reads_of_many_events_give_what_each_event_gives(shape, per_read):
    events = [*shape(40, finish=None)[:-1], shape(40, finish="length")[-1], b"data: [DONE]\n\n"]
    reducer = EventReducer(URL)
    chunks = []
    body = b"".join(events)
    step = sum(len(e) for e in events[:per_read])
    for start in range(0, len(body), step):
        chunks += reducer.feed([body[start : start + step]])
    expected = one_by_one(events[:-1])
    assert tokens(chunks) == (
        [t for ids, _, _ in expected for t in ids],
        [lp for _, lps, _ in expected for lp in lps],
    )
    assert chunks[-1].finish_reason == "length" and reducer.done
    if per_read == 40:
        assert len(chunks) == 1  # one read, one chunk: the newest event alone was parsed


def test_a_weight_version_change_within_a_read_keeps_each_token_s_version():
    events = cumulative(6, version=3)[:3] + cumulative(6, version=4)[3:]
    reducer = EventReducer(URL)
    chunks = reducer.feed([events[0]]) + reducer.feed([b"".join(events[1:])])
    by_version = [(c.weight_version, c.token_ids) for c in chunks]
    assert by_version == [(3, [1]), (3, [2, 3]), (4, [4, 5, 6])]


@pytest.mark.parametrize("shape", [cumulative, incremental])
def test_a_read_in_pieces_gives_one_chunk_per_weight_version(shape):
    """A read's body comes in pieces (the rest of a chunk an earlier read cut off, then the whole
    chunks after it, one per engine write): its tokens still reach the reader as one chunk per
    version."""
    events = shape(9, version=3)[:6] + shape(9, version=4)[6:]
    reducer = EventReducer(URL)
    first = reducer.feed([events[0][:10]])
    pieces = [events[0][10:], b"".join(events[1:4]), events[4][:7], events[4][7:] + b"".join(events[5:])]
    chunks = first + reducer.feed(pieces)
    assert [(c.weight_version, c.token_ids) for c in chunks] == [(3, [1, 2, 3, 4, 5, 6]), (4, [7, 8, 9])]


@pytest.mark.parametrize("shape", [cumulative, incremental])
@pytest.mark.parametrize("seed", range(20))
def test_reads_cut_into_pieces_anywhere_give_what_each_event_gives(shape, seed):
    """Reads of several pieces each, cut at random bytes (a piece may end mid-line, hold no newline,
    or be one byte), with a weight version change and the stream's end among them."""
    rng = random.Random(seed)
    events = [
        *shape(30, version=3)[:17],
        *shape(30, version=4)[17:-1],
        shape(30, version=4, finish="length")[-1],
    ]
    body = b"".join(events) + b"data: [DONE]\n\n"
    cuts = sorted(rng.sample(range(1, len(body)), 40))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    reducer = EventReducer(URL)
    chunks = []
    while pieces:
        take = rng.randint(1, 6)
        read, pieces = pieces[:take], pieces[take:]
        chunks += reducer.feed(read)
    expected = one_by_one(events)
    assert tokens(chunks) == (
        [t for ids, _, _ in expected for t in ids],
        [lp for _, lps, _ in expected for lp in lps],
    )
    assert [v for c in chunks for v in [c.weight_version] * len(c.token_ids)] == [
        v for ids, _, v in expected for _ in ids
    ]
    assert chunks[-1].finish_reason == "length" and reducer.done


def test_a_read_of_many_pieces_parses_only_the_newest_event():
    """A stream read once per flush: a read of several engine writes gives one chunk, the newest
    event's, whatever the pieces before it hold."""
    events = cumulative(24)
    reducer = EventReducer(URL)
    reducer.feed([events[0]])
    writes = [b"".join(events[i : i + 8]) for i in range(1, 24, 8)]
    writes[1] = b"data: {not JSON: no older event is parsed}\n\n" + writes[1]
    chunks = reducer.feed(writes)
    assert len(chunks) == 1 and chunks[0].token_ids == list(range(2, 25))


@pytest.mark.parametrize("cuts", [(), (5,), (5, 40, 41), (300,)])
def test_a_version_change_on_the_first_read_is_seen_too(cuts):
    """Also when the read's first event spans its pieces."""
    events = cumulative(4, version=1)[:2] + cumulative(4, version=2)[2:]
    body = b"".join(events)
    chunks = EventReducer(URL).feed([body[a:b] for a, b in zip((0, *cuts), (*cuts, len(body)), strict=True)])
    assert [(c.weight_version, c.token_ids) for c in chunks] == [(1, [1, 2]), (2, [3, 4])]


def test_lines_split_across_reads_and_a_last_line_without_newline():
    body = b"".join(cumulative(5)) + b"data: [DONE]"
    reducer = EventReducer(URL)
    chunks = [c for start in range(0, len(body), 17) for c in reducer.feed([body[start : start + 17]])]
    assert not reducer.done
    chunks += reducer.end()
    assert tokens(chunks)[0] == [1, 2, 3, 4, 5] and reducer.done


def test_a_line_that_is_not_sse_at_the_end_of_a_read_is_an_error():
    reducer = EventReducer(URL)
    with pytest.raises(EngineResponseError, match="not an SSE data line"):
        reducer.feed([b"".join(cumulative(2)) + b"<html>oops</html>\n"])


@pytest.mark.parametrize(
    "broken, said",
    [
        (b'data: {"error": "out of memory"}\n\n', "out of memory"),  # the engine's word, mid-stream
        (b"data: {this is not json\n\n", "not JSON|JSON"),  # an engine gone wrong
    ],
)
def test_an_event_that_breaks_the_stream_is_reported_and_the_tokens_before_it_kept(broken, said):
    """The events before it came in the same read, and their tokens were made: a resumed sample
    carries on after them rather than generating them again."""
    reducer = EventReducer(URL)
    chunks = reducer.feed([b"".join(cumulative(3)) + broken])
    assert tokens(chunks)[0] == [1, 2, 3]
    assert isinstance(reducer.error, EngineResponseError)
    assert re.search(said, str(reducer.error)), reducer.error


@pytest.mark.parametrize("done", [False, True])
def test_a_read_of_one_event_is_read_at_its_ends(done):
    """The common read of a reader that keeps up: one event (perhaps with the stream's end). Its
    ends are that event, so the reducer parses only its tokens not seen yet, not the whole output."""
    from rollflow.runtime.engines.http import SseLines

    only = event([1, 2, 3], 3)
    lines = SseLines(URL)
    block = lines.feed([only + (b"data: [DONE]\n\n" if done else b"")])
    newest, done_seen = lines.newest(block)
    assert (bytes(newest), done_seen) == (only.rstrip(b"\n"), done)
