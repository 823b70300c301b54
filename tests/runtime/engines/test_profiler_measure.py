"""What `rollflow profile engine` reads from stream arrival times, on streams whose timing is known."""

from __future__ import annotations

import pytest

from rollflow.errors import UserError
from rollflow.runtime.engines.profiler.measure import (
    EngineTimes,
    _steady_gaps,
    best_decode_round,
    token_costs_ms,
)


def _one_chunk(start: float, arrival: float, tokens: int) -> list[float]:
    """A stream whose `tokens` tokens all arrived together (a reader that fell behind the engine)."""
    return [start, *[arrival] * tokens]


def test_a_stream_that_arrives_in_one_chunk_times_no_iteration():
    assert _steady_gaps([_one_chunk(0.0, 0.05, 8)], 16) == ([], [])
    # beside a stream whose tokens came in two chunks: only that one's mean gap after its first chunk
    two_chunks = [0.0, 0.01, 0.01, 0.01, 0.04, 0.04, 0.04, 0.04, 0.04]  # 5 tokens 30 ms after the first 3
    gaps, kvs = _steady_gaps([_one_chunk(0.0, 0.05, 8), two_chunks], 16)
    assert gaps == [pytest.approx(0.03 / 5)] and kvs == [16 + 3]


def test_a_decode_round_that_timed_nothing_does_not_make_decodes_and_prefills_free():
    # round 0's batch-1 stream came in one chunk, round 1 timed 2 ms iterations: before, round 0's
    # mean gap of 0 was the least disturbed round, so the floor of a prefill was 0 and the shortest
    # prompt's whole time to first token counted as round trip, leaving its prefill a cost of 0
    rounds = [
        dict(zip(("gaps", "kvs"), _steady_gaps([_one_chunk(0.0, 0.02, 8)], 16), strict=True)),
        dict(zip(("gaps", "kvs"), _steady_gaps([[0.0, 0.01, 0.012, 0.014, 0.016]], 16), strict=True)),
    ]
    gaps, kv = best_decode_round(rounds, 1, 16)
    assert gaps == [pytest.approx(0.002)] * 3 and kv == 17
    times = EngineTimes(
        decode_s={(1, 16): gaps}, decode_kv={(1, 16): kv}, prefill_s={16: [0.010], 128: [0.013]},
        wake_s=[0.0], admit_s={}, elapsed_s=1.0, num_resumed=0, num_steps=4,
    )  # fmt: skip
    costs = token_costs_ms(times, layers=2)
    assert costs[16] == [pytest.approx(1.0)]  # the 2 ms lone decode over 2 layers, not 0
    assert costs[128] == [pytest.approx(2.5)]  # 13 ms less the 8 ms round trip


def test_a_decode_mix_no_round_of_which_was_timed_is_a_clear_error():
    unmeasured = {"gaps": [], "kvs": []}
    with pytest.raises(UserError, match="decode batch 4, prompt 96: every round's streams arrived whole"):
        best_decode_round([unmeasured, unmeasured], 4, 96)
