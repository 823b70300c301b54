"""`rollflow profile engine`: measure a running engine's iterations from its streams (measure.py)."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_command, profiling_progress


def add_profile_engine(profile: argparse.ArgumentParser) -> None:
    """Add `engine` to `rollflow profile`."""
    engine = add_command(profile, "engine", _engine)
    engine.add_argument("--url", required=True, help="the engine's base URL")
    engine.add_argument("--kind", default="builtin", choices=["builtin", "sglang", "vllm"], help="engine API")
    engine.add_argument("--model-config", required=True, help="config.json of the served model (its shape)")
    engine.add_argument("--out", required=True, help="output folder for mlp.csv, attention.csv")
    engine.add_argument("--batch-sizes", default="1,2,4,8,16", help="concurrent decodes (default 1,2,4,8,16)")
    engine.add_argument(
        "--prompt-lengths",
        default="1,16,64,256,1024",
        help="prompt tokens (default 1,16,64,256,1024; the shortest, best 1, measures the round trip)",
    )
    engine.add_argument(
        "--decode-prompt-lengths",
        default="16,128,512",
        help="prompt tokens of the decoding requests (default 16,128,512): each batch decodes at KV lengths "
        "from each to it plus --decode-tokens; keep the longest within the engine's max model length",
    )
    engine.add_argument(
        "--decode-tokens", type=int, default=32, help="tokens per decoding request (default 32)"
    )
    engine.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of every request mix; each mix keeps its fastest round (default 3)",
    )
    engine.add_argument(
        "--block-size", type=int, default=16, help="KV block size in attention.csv (default 16)"
    )
    engine.add_argument(
        "--memory-moves",
        action="store_true",
        help="also time the engine freeing its memory and taking it back, --repeats times (it serves again "
        "after), printed as rl-sim's scheduling.release_s and resume_s; needs an engine that can release "
        "(built-in, SGLang, vLLM with sleep mode)",
    )


def _int_list(flag: str, value: str) -> tuple[int, ...]:
    from rollflow.errors import UserError

    try:
        numbers = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated integers, got {value!r}") from None
    if min(numbers) < 1:
        raise UserError(f"{flag}: every value must be at least 1, got {value!r}")
    return numbers


def _engine(args: argparse.Namespace, started_at: float) -> None:
    """measure a running engine's iteration time from its streams; write tables rollflow sim reads

    Send controlled request mixes to a running engine (concurrent decodes at each --batch-sizes
    size after each --decode-prompt-lengths prompt; single prompts at each --prompt-lengths
    length), read per-iteration times from the token streams, and write mlp.csv/attention.csv in
    Vidur's format: the whole iteration time per layer at each batch's token count (fixed
    per-iteration overhead included), and what a decode batch costs beyond its tokens as decode
    attention at its batch size and KV length. Also measured and printed as simulation overrides:
    the request round trip (execution.request_overhead_ms), the wake-up of an engine that idled
    (execution.idle_wakeup_ms) and what admitting a request beside running decodes adds to that
    iteration (execution.admission_ms). Interrupted runs resume from OUT/profile_progress.jsonl;
    delete it to profile the engine anew.

    example: rollflow profile engine --url http://127.0.0.1:30000 --kind builtin
    --model-config models/tiny/config.json --out outputs/profile/engine
    """
    import asyncio
    import statistics
    from pathlib import Path

    from rollflow.errors import UserError
    from rollflow.perf.profile.hf_config import load_model_config
    from rollflow.runtime.engines.base import EngineError
    from rollflow.runtime.engines.profiler.measure import (
        WAKE_IDLE_S,
        EngineProbe,
        admission_s,
        idle_wakeup_s,
        measure_engine,
        memory_moves_s,
        round_trip_s,
        write_engine_tables,
    )

    model = load_model_config(args.model_config)
    if args.decode_tokens < 4 or args.repeats < 1:
        raise UserError("--decode-tokens must be at least 4 and --repeats at least 1")
    probe = EngineProbe(
        kind=args.kind,
        url=args.url.rstrip("/"),
        batch_sizes=_int_list("--batch-sizes", args.batch_sizes),
        prompt_lengths=_int_list("--prompt-lengths", args.prompt_lengths),
        decode_prompt_lengths=_int_list("--decode-prompt-lengths", args.decode_prompt_lengths),
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
    )
    out = Path(args.out)
    heading = (
        f"profiling the {args.kind} engine at {probe.url}: {len(probe.batch_sizes)} decode batches "
        f"x {len(probe.decode_prompt_lengths)} KV lengths x {args.decode_tokens} tokens, "
        f"{len(probe.prompt_lengths)} prompt lengths; {args.repeats} rounds"
    )
    with profiling_progress(heading) as on_step:
        try:
            times = asyncio.run(measure_engine(probe, out, on_step=on_step))
        except EngineError as exc:
            raise UserError(f"engine at {probe.url}: {exc}") from None
    write_engine_tables(out, model, times, args.block_size)
    for (batch, prompt), gaps in sorted(times.decode_s.items()):
        print(
            f"decode batch {batch}, KV {times.decode_kv[batch, prompt]:.0f}: "
            f"{statistics.median(gaps) * 1e3:.2f} ms per iteration"
        )
    for length, ttfts in times.prefill_s.items():
        print(f"prompt {length} tokens: {statistics.median(ttfts) * 1e3:.2f} ms to first token")
    round_trip_ms = round_trip_s(times) * 1e3
    print(
        f"request round trip {round_trip_ms:.2f} ms, taken out of the prefill times "
        f"(simulate it with execution.request_overhead_ms={round_trip_ms:.2f})"
    )
    wakeup_ms = idle_wakeup_s(times) * 1e3
    print(
        f"wake-up after {WAKE_IDLE_S * 1e3:.0f} ms idle {wakeup_ms:.2f} ms, added to the next request's "
        f"first token (simulate it with execution.idle_wakeup_ms={wakeup_ms:.2f})"
    )
    admission_ms = admission_s(times, model.num_layers) * 1e3
    print(
        f"admission beside running decodes {admission_ms:.2f} ms per request beyond its tokens "
        f"(simulate it with execution.admission_ms={admission_ms:.2f})"
    )
    if args.memory_moves:
        try:
            release_s, resume_s = asyncio.run(memory_moves_s(args.kind, probe.url, args.repeats))
        except EngineError as exc:
            raise UserError(
                f"engine at {probe.url} cannot release its memory ({exc}): leave out --memory-moves"
            ) from None
        print(
            f"memory release {release_s * 1e3:.2f} ms, resume {resume_s * 1e3:.2f} ms (simulate them with "
            f"scheduling.release_s={release_s:.4f} scheduling.resume_s={resume_s:.4f})"
        )
    resumed = f" ({times.num_resumed} resumed from an earlier run)" if times.num_resumed else ""
    print(
        f"measured {times.num_steps - times.num_resumed} of {times.num_steps} request mixes in "
        f"{times.elapsed_s:.1f} s{resumed}; wrote {out / 'mlp.csv'}, {out / 'attention.csv'}"
    )
