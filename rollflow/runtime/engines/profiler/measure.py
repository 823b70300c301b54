"""`rollflow profile engine`: measure a running serving engine from outside, through its streams.

An engine's iteration is what the simulator times, and a client sees iterations as token
arrivals: while B requests decode together, each stream receives one token per iteration, so
the gaps between a stream's tokens are the iteration time at decode batch B; a lone request's
time to first token is its prefill iteration plus the request's round trip (estimated from the
shortest prompt and taken out, see `round_trip_s`). The profiler sends such controlled mixes
(B concurrent decodes for each batch size; one prompt of P tokens for each prompt length) and
reads the timings from the streams. Decodes are measured at several prompt lengths
(`decode_prompt_lengths`), since a decode's attention reads its whole KV: each decode row is
written at the mean KV length its sequences had over the measured gaps.

It writes them as Vidur-format tables split the way the simulator composes an iteration (per
layer: linear operators at the batch's token count + decode attention at the decode batch size +
prefill attention): the prefill iterations, divided by the model's layers, are the per-token
cost in `mlp.csv` (what every token pays going through the weights, with the iteration's fixed
overhead); what a decode batch of B costs beyond B such tokens (attention over each sequence's
KV, sampling, per-sequence bookkeeping) is decode attention at batch B and that KV length in
`attention.csv`, the (batch, KV length) grid the simulator reads for Vidur's attention tables. A
decode-only or prefill-only iteration is then charged what the engine took for it, and a mixed
one (B decodes beside a prefill chunk of P tokens) the tokens' cost at B + P plus the B decodes'
own cost, rather than the token count alone. A CPU engine, whose time is mostly fixed
per-iteration overhead, gets a faithful table that way; operator profiles would miss the overhead.

Two costs sit outside the iterations and are printed for the simulation's config rather than
written to the tables: the request's round trip (`round_trip_s`, execution.request_overhead_ms)
and the wake-up of an engine that idled (`idle_wakeup_s`, execution.idle_wakeup_ms): every
mix follows another at once, so the tables hold an awake engine's times, while at light load
most requests find the engine idle (vLLM's CPU server took about 3 ms longer to first token
after 50 ms or more of idle).

What the tables cannot say: prefill attention's dependence on the cached prefix (a chunk's
cost is its tokens' cost; prefill attention is written as zero).
"""

from __future__ import annotations

import asyncio
import csv
import itertools
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rollflow.errors import UserError
from rollflow.perf.profile.hf_config import ProfiledModel
from rollflow.perf.profile.operators import ATTENTION_OPS, MLP_OPS
from rollflow.perf.profile.progress import ProgressLog
from rollflow.perf.profile.timing import STATS

# The operator column that carries the engine's whole iteration time (per layer) in mlp.csv.
ITERATION_COLUMN = "attn_pre_proj"
# How long the engine idles before each wake-up measurement: long enough for the whole cost (on
# vLLM's CPU server the extra time to first token grew over the first 50 ms of idle, then held).
WAKE_IDLE_S = 0.25
# The prompt of a request admitted beside running decodes: short, so no engine chunks it.
NEWCOMER_TOKENS = 16
# A decode token of the admitting iteration may reach its stream this long before or after the
# newcomer's first token (an engine's server sends an iteration's outputs one stream at a time).
SAME_ITERATION_S = 0.0015


@dataclass(frozen=True)
class EngineProbe:
    kind: str  # engine client kind: builtin, sglang, vllm
    url: str
    batch_sizes: tuple[int, ...]  # concurrent decodes per measurement
    prompt_lengths: tuple[int, ...]  # prompt tokens of the prefill measurements
    decode_prompt_lengths: tuple[int, ...]  # prompt lengths of the decoding requests
    decode_tokens: int  # tokens each decoding request generates
    repeats: int  # rounds of every mix


@dataclass(frozen=True)
class EngineTimes:
    decode_s: dict[tuple[int, int], list[float]]  # (batch, prompt) -> steady gaps of its best round
    decode_kv: dict[tuple[int, int], float]  # (batch, prompt) -> mean KV length over those gaps
    prefill_s: dict[int, list[float]]  # prompt tokens -> [time to first token of its best round]
    wake_s: list[float]  # per round: the shortest prompt's TTFT after WAKE_IDLE_S idle less without
    admit_s: dict[int, list[tuple[float, float]]]  # batch -> per round (admitting gap, plain gap), medians
    elapsed_s: float  # measuring in this run
    num_resumed: int  # rounds of mixes read back from an interrupted run's progress file
    num_steps: int  # rounds of mixes in the profile


def _prompt(num_tokens: int, salt: int) -> list[int]:
    """A prompt of token ids well inside any vocabulary (specials sit at 0-2 in rollflow's tiny
    model), drawn from a generator seeded by `salt`: prompts of different salts share no KV block,
    so an engine's prefix cache serves none of them to another (an arithmetic sequence per salt
    had only 250 distinct prompts, and a profile of ~300 requests repeated some)."""
    draw = random.Random(salt).randrange
    return [3 + draw(250) for _ in range(num_tokens)]


async def _stream_times(
    client,
    rid: str,
    prompt: list[int],
    num_tokens: int,
    start: float,
    times: list[float] | None = None,
    on_chunk: Callable[[], None] = lambda: None,
) -> list[float]:
    """`start`, then the arrival time of each token of a greedy stream, appended to `times` (a new
    list by default) as they come, `on_chunk` called after each chunk."""
    from rollflow.runtime.wire.base import SamplingParams

    sampling = SamplingParams(max_new_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    times = [] if times is None else times
    times.append(start)
    async for chunk in client.generate(rid, prompt, sampling):
        now = time.perf_counter()
        times.extend([now] * len(chunk.token_ids))
        on_chunk()
    return times


async def measure_engine(
    probe: EngineProbe, out: Path, on_step: Callable[[int, int], None] = lambda done, total: None
) -> EngineTimes:
    """Run the request mixes one after another (never overlapping), `repeats` rounds of every mix,
    and keep each mix's least disturbed round (see `least_disturbed`). Each round of a mix is kept in
    `out`'s progress file as soon as it is measured, so an interrupted profile resumes from it."""
    from rollflow.runtime.engines.clients import make_client

    decode_mixes = list(itertools.product(probe.batch_sizes, probe.decode_prompt_lengths))
    steps = [
        *(("decode", r, batch, prompt) for r in range(probe.repeats) for batch, prompt in decode_mixes),
        *(("prefill", r, length) for r in range(probe.repeats) for length in probe.prompt_lengths),
        *(("wake", r, min(probe.prompt_lengths)) for r in range(probe.repeats)),
        *(("admit", r, batch) for r in range(probe.repeats) for batch in probe.batch_sizes),
    ]
    # rounds, not repeats in a row: a burst of other work on the machine then disturbs one round of
    # several mixes rather than every round of one
    steps.sort(key=lambda step: step[1])
    out.mkdir(parents=True, exist_ok=True)
    progress = ProgressLog(out, {"engine_probe": asdict(probe)})
    resumed = sum(1 for step in steps if step in progress)
    done = resumed
    on_step(done, len(steps))
    started = time.perf_counter()
    client = make_client(probe.kind, probe.url)
    # a new salt range per run: a second profile of the same engine finds nothing cached
    salt = random.getrandbits(48)
    try:
        with progress:
            if resumed < len(steps):
                await _stream_times(client, "profile-warmup", _prompt(8, salt), 4, time.perf_counter())
            for step in steps:
                if step in progress:
                    continue
                salt += max(probe.batch_sizes)  # past the previous step's prompts
                progress.record(step, await _measure_step(client, probe, step, salt))
                done += 1
                on_step(done, len(steps))
    finally:
        await client.close()
    decode_s, decode_kv, prefill_s = {}, {}, {}
    for batch, prompt in decode_mixes:
        rounds = [progress["decode", r, batch, prompt] for r in range(probe.repeats)]
        decode_s[batch, prompt], decode_kv[batch, prompt] = best_decode_round(rounds, batch, prompt)
    for length in probe.prompt_lengths:
        prefill_s[length] = least_disturbed([[progress["prefill", r, length]] for r in range(probe.repeats)])
    shortest = min(probe.prompt_lengths)
    wake_s = [progress["wake", r, shortest] - progress["prefill", r, shortest] for r in range(probe.repeats)]
    admit_s = {
        batch: [tuple(m) for r in range(probe.repeats) if (m := progress["admit", r, batch]) is not None]
        for batch in probe.batch_sizes
    }
    elapsed = time.perf_counter() - started
    return EngineTimes(decode_s, decode_kv, prefill_s, wake_s, admit_s, elapsed, resumed, len(steps))


async def memory_moves_s(kind: str, url: str, repeats: int) -> tuple[float, float]:
    """Median seconds the engine takes to free its memory and to take it back (SGLang's
    release/resume_memory_occupation, vLLM's sleep/wake_up), each round trip included: what a rollout
    instance handing its device to the trainer costs, and waking it at step end (rl-sim's
    scheduling.release_s and resume_s). The engine serves again afterwards, on the same weights."""
    from rollflow.runtime.engines.clients import make_client

    client = make_client(kind, url)
    releases, resumes = [], []
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            await client.release_memory_occupation()
            released = time.perf_counter()
            await client.resume_memory_occupation()
            releases.append(released - started)
            resumes.append(time.perf_counter() - released)
    finally:
        await client.close()
    return statistics.median(releases), statistics.median(resumes)


async def _measure_step(client, probe: EngineProbe, step: tuple, salt: int) -> dict | float:
    """One round of one mix: B concurrent decodes ({gaps, kvs}), or one prompt's time to first token
    (after the engine idled WAKE_IDLE_S, for a wake step). Its requests' prompts are seeded from
    salt, salt + 1, ..."""
    if step[0] == "admit":
        return await _admission_round(
            client, step[2], min(probe.decode_prompt_lengths), probe.decode_tokens, salt
        )
    if step[0] == "wake":
        await asyncio.sleep(WAKE_IDLE_S)
    if step[0] in ("prefill", "wake"):
        length = step[2]
        rid = f"profile-{step[0][0]}{length}-{salt}"
        times = await _stream_times(client, rid, _prompt(length, salt), 1, time.perf_counter())
        return times[1] - times[0]
    _, _, batch, prompt = step
    gaps, kvs = await decode_gaps(client, batch, prompt, probe.decode_tokens, salt)
    return {"gaps": gaps, "kvs": kvs}


async def decode_gaps(
    client, batch: int, prompt: int, decode_tokens: int, salt: int
) -> tuple[list[float], list[int]]:
    """`batch` concurrent requests of `prompt` tokens decoding `decode_tokens` each: the gaps between
    tokens while all of them decode, and each gap's KV length (see `_steady_gaps`). Also how the
    fidelity benchmark checks, around each replay, that the engine still runs at its profiled speed."""
    start = time.perf_counter()
    streams = await asyncio.gather(
        *(
            _stream_times(
                client, f"profile-d{batch}-{salt}-{i}", _prompt(prompt, salt + i), decode_tokens, start
            )
            for i in range(batch)
        )
    )
    return _steady_gaps(streams, prompt)


async def _admission_round(
    client, batch: int, prompt: int, decode_tokens: int, salt: int
) -> tuple[float, float] | None:
    """`batch` decodes, and once every one has a few tokens a newcomer of NEWCOMER_TOKENS prompt
    tokens: the median gap of the decodes' iteration that prefilled it, and their median gap
    otherwise. None when no decode was running when the newcomer's first token came (an engine
    whose batch cap `batch` fills admits it only once they finish)."""
    streams: list[list[float]] = [[] for _ in range(batch)]  # each: its start, then its tokens
    under_way = asyncio.Event()

    def check_under_way() -> None:
        if all(len(times) > 3 for times in streams):  # three tokens each
            under_way.set()

    start = time.perf_counter()
    decodes = asyncio.gather(
        *(
            _stream_times(
                client,
                f"profile-a{batch}-{salt}-{i}",
                _prompt(prompt, salt + i),
                decode_tokens,
                start,
                times=streams[i],
                on_chunk=check_under_way,
            )
            for i in range(batch)
        )
    )
    waiting = asyncio.ensure_future(under_way.wait())
    await asyncio.wait([decodes, waiting], return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    newcomer = await _stream_times(
        client, f"profile-n{batch}-{salt}", _prompt(NEWCOMER_TOKENS, salt + batch), 1, time.perf_counter()
    )
    await decodes
    first = newcomer[1]
    admitting, plain = [], []
    for times in streams:  # gaps from the second token on
        gaps = [(a, b) for a, b in itertools.pairwise(times[2:]) if b > a]
        # the gap that ends with the newcomer's first token, while this decode goes on after it
        held = next(((a, b) for a, b in gaps[:-1] if a < first <= b + SAME_ITERATION_S), None)
        if held is None:
            continue
        admitting.append(held[1] - held[0])
        plain += [b - a for a, b in gaps if (a, b) != held]
    if not admitting or not plain:
        return None
    return statistics.median(admitting), statistics.median(plain)


def least_disturbed(rounds: list[list[float]]) -> list[float]:
    """The round with the lowest median: other processes on the machine only ever add time to an
    iteration, so the fastest round is the engine's own time, the others the engine plus them."""
    return min(rounds, key=statistics.median)


def best_decode_round(rounds: list[dict], batch: int, prompt: int) -> tuple[list[float], float]:
    """The least disturbed of a decode mix's rounds ({gaps, kvs} each): its gaps and their mean KV
    length. A round that timed no gap (every stream arrived in one chunk, see `_steady_gaps`) is left
    out; a UserError when no round timed one, rather than a decode that costs nothing."""
    measured = [round_ for round_ in rounds if round_["gaps"]]
    if not measured:
        raise UserError(
            f"decode batch {batch}, prompt {prompt}: every round's streams arrived whole, in one chunk "
            "each, so no iteration could be timed; profile again with more --decode-tokens or --repeats, "
            "or on a less loaded machine"
        )
    best = least_disturbed([round_["gaps"] for round_ in measured])
    [kvs] = [round_["kvs"] for round_ in measured if round_["gaps"] is best]
    return best, statistics.fmean(kvs)


def _steady_gaps(streams: list[list[float]], prompt: int) -> tuple[list[float], list[int]]:
    """Gaps between consecutive tokens while every stream of the batch was decoding, and the KV
    length of each gap's iteration: the one after a stream's k-th token holds the prompt and k - 1
    generated tokens (the simulator's count of a decode's processed tokens).

    When no gap lies in that window (streams delivered several tokens per chunk), each stream's mean
    gap after its first chunk stands in: the time from it to the last token over the tokens that came
    later, one iteration each. A stream that came in one chunk timed no iteration and gives none, so
    a round whose every stream did gives no gaps at all (a mean of 0 would read as a free decode)."""
    window_start = max(times[1] for times in streams)  # every request has its first token
    window_end = min(times[-1] for times in streams)  # no request has finished
    gaps, kvs = [], []
    for times in streams:
        for k, (earlier, later) in enumerate(itertools.pairwise(times[1:])):
            if earlier >= window_start and later <= window_end and later > earlier:
                gaps.append(later - earlier)
                kvs.append(prompt + k)
    if not gaps:
        for times in streams:
            later = sum(1 for arrival in times[2:] if arrival > times[1])  # tokens after the first chunk
            if later:
                gaps.append((times[-1] - times[1]) / later)
                kvs.append(prompt + (len(times) - 2) // 2)
    return gaps, kvs


def round_trip_s(times: EngineTimes) -> float:
    """What a lone request's TTFT holds besides its prefill iteration (HTTP, tokenizer, queue hand-off).

    A one-token prompt's prefill costs one decode iteration at batch 1 (one token through the
    weights), so the rest of its TTFT is the round trip, taken out of every prefill time: the
    simulator's iterations have none (it adds the round trip per request instead, with
    execution.request_overhead_ms). The shortest prompt stands in for one token: the longer it is,
    the more of its prefill is counted as round trip on a model whose compute matters. 0 without
    batch-1 decodes.
    """
    lone = lone_decode_s(times)
    if lone is None:
        return 0.0
    shortest = statistics.median(times.prefill_s[min(times.prefill_s)])
    return max(shortest - lone, 0.0)


def idle_wakeup_s(times: EngineTimes) -> float:
    """What an idle engine adds to the next request's time to first token: the shortest prompt's
    TTFT after the engine idled, less the same prompt's TTFT right after other work (the prefill
    mixes always follow another mix), in the same round; the median over rounds, not the least, as
    the wake-up is the engine's own and varies by itself (on vLLM's CPU server a round now and
    then finds it awake). An idle CPU engine's threads go to sleep, a GPU's clocks drop; the
    simulator charges it to the first iteration after an idle (execution.idle_wakeup_ms)."""
    return max(statistics.median(times.wake_s), 0.0)


def lone_decode_s(times: EngineTimes) -> float | None:
    """Median iteration of a lone decode at the shortest profiled prompt (None without batch 1)."""
    prompts = [prompt for batch, prompt in times.decode_s if batch == 1]
    return statistics.median(times.decode_s[1, min(prompts)]) if prompts else None


def _stats(values_ms: list[float]) -> dict[str, float]:
    return {
        "min": min(values_ms),
        "max": max(values_ms),
        "mean": statistics.fmean(values_ms),
        "median": statistics.median(values_ms),
        "std": statistics.pstdev(values_ms),
    }


def _token_cost(prefill_ms: dict[int, list[float]], num_tokens: int) -> float:
    """Per-layer cost of `num_tokens` tokens through the weights, as the simulator reads mlp.csv:
    rounded up to a multiple of 8, linear between the prompt lengths, clamped at both ends."""
    lengths = sorted(prefill_ms)
    medians = [statistics.median(prefill_ms[n]) for n in lengths]
    return float(np.interp((num_tokens + 7) // 8 * 8, lengths, medians))


def token_costs_ms(times: EngineTimes, layers: int) -> dict[int, list[float]]:
    """Per prompt length, its prefill iteration per layer (ms): the time to first token less the
    round trip. No iteration is shorter than a one-token decode: the floor keeps a noisy TTFT (a
    busy CPU can make a short prompt's round trip look longer than a long prompt's) from a zero."""
    round_trip = round_trip_s(times)
    floor = lone_decode_s(times) or 0.0
    return {
        length: [max(ttft - round_trip, floor) * 1e3 / layers for ttft in ttfts]
        for length, ttfts in times.prefill_s.items()
    }


def admission_s(times: EngineTimes, layers: int) -> float:
    """What an iteration that admits a request beside B running decodes takes beyond what the
    tables charge it (the tokens' cost at B + NEWCOMER_TOKENS instead of B): per round, the
    admitting gap less the plain gap less that difference; the median over every batch size's
    rounds (the engine's own cost, not a disturbance: not the least), 0 without any."""
    costs = token_costs_ms(times, layers)
    residuals = [
        admitting
        - plain
        - (_token_cost(costs, batch + NEWCOMER_TOKENS) - _token_cost(costs, batch)) * layers * 1e-3
        for batch, rounds in times.admit_s.items()
        for admitting, plain in rounds
    ]
    return max(statistics.median(residuals), 0.0) if residuals else 0.0


def write_engine_tables(out: Path, model: ProfiledModel, times: EngineTimes, block_size: int) -> None:
    """mlp.csv: prefill iteration time / layers at each prompt length; attention.csv: each decode
    batch's time beyond its tokens' cost, as decode attention at that batch size and mean KV length."""
    out.mkdir(parents=True, exist_ok=True)
    layers = model.num_layers
    prefill_ms = token_costs_ms(times, layers)
    decode_ms = {}
    for (batch, prompt), gaps in times.decode_s.items():
        tokens_ms = _token_cost(prefill_ms, batch)
        kv = round(times.decode_kv[batch, prompt])
        # the statistics, not each gap, are held at 0: the median row is then exactly the median
        # gap's excess over the tokens (an even count's median of clamped gaps can exceed it)
        excess = _stats([gap * 1e3 / layers - tokens_ms for gap in gaps])
        decode_ms[batch, kv] = {
            stat: value if stat == "std" else max(value, 0.0) for stat, value in excess.items()
        }
    with (out / "mlp.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                *(f"time_stats.{op}.{stat}" for op in MLP_OPS for stat in STATS),
                "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp",
                "num_tokens", "num_tensor_parallel_workers",
            ]
        )  # fmt: skip
        for num_tokens in sorted(prefill_ms):
            stats = _stats(prefill_ms[num_tokens])
            writer.writerow(
                [
                    *(stats[stat] if op == ITERATION_COLUMN else 0.0 for op in MLP_OPS for stat in STATS),
                    model.num_q_heads, model.num_kv_heads, model.embedding_dim, model.mlp_hidden_dim,
                    model.vocab_size, True, num_tokens, 1,
                ]
            )  # fmt: skip
    with (out / "attention.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                *(f"time_stats.{op}.{stat}" for op in ATTENTION_OPS for stat in STATS),
                "n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers",
                "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill", "attention_backend",
            ]
        )  # fmt: skip
        zeros = [0.0] * len(STATS)
        blank = [""] * len(STATS)
        rows = [
            (batch, 0, kv, [stats[stat] for stat in STATS])
            for (batch, kv), stats in sorted(decode_ms.items())
        ]
        rows += [(1, 1, 0, zeros), (1, max(prefill_ms), 0, zeros)]
        for batch, chunk, kv, values in rows:
            # column groups: prefill, kv-cache save, decode (as ATTENTION_OPS orders them)
            attention = (zeros, zeros, blank) if chunk else (blank, zeros, values)
            writer.writerow(
                [
                    *(value for column in attention for value in column),
                    model.embedding_dim, model.num_q_heads, model.num_kv_heads, block_size, 1,
                    batch, chunk, kv, bool(chunk), "engine (tokens in mlp.csv)",
                ]
            )  # fmt: skip
