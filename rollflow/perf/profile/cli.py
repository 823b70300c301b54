"""`rollflow profile ...`: measure operators on this machine and write tables `rollflow sim` reads."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_command_group

EXAMPLES = """examples:
  rollflow engine init-model models/tiny && rollflow profile ops --model-config models/tiny/config.json --device cpu --out outputs/profile/tiny --grid small
  rollflow profile ops --model-config llama7b/config.json --device cuda --out outputs/profile/llama7b --tp 1,2,4
  rollflow profile engine --url http://127.0.0.1:30000 --kind builtin --model-config models/tiny --out outputs/profile/engine
"""


def register(commands: argparse._SubParsersAction) -> None:
    profile_commands = add_command_group(
        commands,
        "profile",
        "measure a model's operators, or a running engine; write Vidur-format tables",
        EXAMPLES,
    )
    ops = profile_commands.add_parser(
        "ops",
        help="time one layer's operators over a grid of shapes; write mlp.csv and attention.csv",
        description="Time the operators of one layer of the model a Hugging Face config.json describes "
        "(random weights, nothing downloaded) on the present device, each tensor-parallel size as its "
        "sharded shapes, with warm-up and repeated timing (CUDA events on a GPU). Writes Vidur-format "
        "mlp.csv and attention.csv that `rollflow sim` reads with execution.kind=tables. Interrupted runs "
        "resume from OUT/profile_progress.jsonl.",
        epilog="example: rollflow profile ops --model-config models/tiny/config.json --device cpu "
        "--out outputs/profile/tiny --grid small",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ops.add_argument("--model-config", required=True, help="a Hugging Face config.json (or its folder)")
    ops.add_argument("--device", required=True, choices=["cpu", "cuda"], help="where to run the operators")
    ops.add_argument("--out", required=True, help="output folder for mlp.csv, attention.csv")
    ops.add_argument("--tp", default="1", help="comma-separated tensor-parallel sizes (default 1)")
    ops.add_argument(
        "--grid", default="default", choices=["small", "default"], help="grid of shapes (default: default)"
    )
    ops.add_argument(
        "--dtype", choices=["float32", "float16", "bfloat16"], help="default: float16 on cuda, float32 on cpu"
    )
    ops.add_argument("--block-size", type=int, default=16, help="KV-cache block size (default 16)")
    ops.add_argument(
        "--max-model-len", type=int, help="longest context profiled (default: the model's, at most 4096)"
    )
    ops.add_argument("--max-batch-size", type=int, default=128, help="largest decode batch (default 128)")
    ops.add_argument(
        "--max-kv-tokens", type=int, default=262144, help="cap on decode batch x KV length (default 262144)"
    )
    ops.add_argument("--warmup", type=int, default=3, help="untimed calls before timing (default 3)")
    ops.add_argument("--repeats", type=int, default=10, help="timed calls per point (default 10)")
    ops.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ops.set_defaults(handler=_ops)

    engine = profile_commands.add_parser(
        "engine",
        help="measure a running engine's iteration time from its streams; write tables rollflow sim reads",
        description="Send controlled request mixes to a running engine (concurrent decodes at each --batch-sizes "
        "size after each --decode-prompt-lengths prompt; single prompts at each --prompt-lengths length), read "
        "per-iteration times from the token streams, and write mlp.csv/attention.csv in Vidur's format: the "
        "whole iteration time per layer at each batch's token count (fixed per-iteration overhead included), "
        "and what a decode batch costs beyond its tokens as decode attention at its batch size and KV length. "
        "Also measured and printed as simulation overrides: the request round trip "
        "(execution.request_overhead_ms), the wake-up of an engine that idled (execution.idle_wakeup_ms) and "
        "what admitting a request beside running decodes adds to that iteration (execution.admission_ms). "
        "Interrupted runs resume from OUT/profile_progress.jsonl; delete it to profile the engine anew.",
        epilog="example: rollflow profile engine --url http://127.0.0.1:30000 --kind builtin "
        "--model-config models/tiny/config.json --out outputs/profile/engine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    engine.set_defaults(handler=_engine)


def _ops(args: argparse.Namespace, started_at: float) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rollflow.errors import UserError
    from rollflow.perf.profile.grid import build_grid
    from rollflow.perf.profile.hf_config import check_tensor_parallel, load_model_config
    from rollflow.perf.profile.ops import ProfileSettings, profile_ops

    model = load_model_config(args.model_config)
    try:
        tensor_parallel = tuple(int(tp) for tp in args.tp.split(","))
    except ValueError:
        raise UserError(f"--tp: expected comma-separated integers, got {args.tp!r}") from None
    if args.max_model_len is None:
        args.max_model_len = min(4096, model.max_position_embeddings)
    for name in ("block_size", "max_model_len", "max_batch_size", "max_kv_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be at least 1")
    if args.warmup < 0 or min(tensor_parallel) < 1:
        raise UserError("--warmup must be at least 0 and --tp sizes at least 1")
    for tp in tensor_parallel:
        check_tensor_parallel(model, tp)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is present")
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = ProfileSettings(
        device=args.device,
        dtype=args.dtype or ("float16" if args.device == "cuda" else "float32"),
        tensor_parallel=tensor_parallel,
        grid=args.grid,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_batch_size=args.max_batch_size,
        max_kv_tokens=args.max_kv_tokens,
        warmup=args.warmup,
        repeats=args.repeats,
    )
    grid = build_grid(settings.grid, settings.max_model_len, settings.max_batch_size, settings.max_kv_tokens)
    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    )
    console = Console(stderr=True)
    console.print(
        f"profiling {model.name} on {device_name}, {settings.dtype}: {grid.size} points per tensor-parallel "
        f"size ({len(grid.num_tokens)} token counts, {len(grid.decode)} decode, {len(grid.prefill)} prefill) "
        f"x tp {args.tp} = {grid.size * len(tensor_parallel)} points, {settings.warmup} warm-up + "
        f"{settings.repeats} timed calls each"
    )
    with Progress(
        TextColumn("profiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("profiling", total=None)
        result = profile_ops(
            model,
            settings,
            args.out,
            on_point=lambda done, total: progress.update(task, completed=done, total=total),
        )
    resumed = f" ({result.num_resumed} resumed from an earlier run)" if result.num_resumed else ""
    print(
        f"measured {result.num_points - result.num_resumed} of {result.num_points} points in "
        f"{result.measured_s:.1f} s{resumed}; wrote {result.out_dir / 'mlp.csv'}, {result.out_dir / 'attention.csv'}"
    )
    print(
        "simulate with: rollflow sim serve --config CONFIG execution.kind=tables "
        f"execution.compute_table={result.out_dir / 'mlp.csv'} execution.attention_table={result.out_dir / 'attention.csv'} "
        f"scheduler.block_size={settings.block_size} cluster.model={model.name} "
        + " ".join(
            f"cluster.model_shape.{key}={getattr(model, key)}"
            for key in (
                "num_layers",
                "num_q_heads",
                "num_kv_heads",
                "embedding_dim",
                "mlp_hidden_dim",
                "vocab_size",
            )
        )
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
    import asyncio
    import statistics
    from pathlib import Path

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rollflow.errors import UserError
    from rollflow.perf.profile.engine import (
        WAKE_IDLE_S,
        EngineProbe,
        admission_s,
        idle_wakeup_s,
        measure_engine,
        memory_moves_s,
        round_trip_s,
        write_engine_tables,
    )
    from rollflow.perf.profile.hf_config import load_model_config
    from rollflow.runtime.engines.base import EngineError

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
    console = Console(stderr=True)
    console.print(
        f"profiling the {args.kind} engine at {probe.url}: {len(probe.batch_sizes)} decode batches "
        f"x {len(probe.decode_prompt_lengths)} KV lengths x {args.decode_tokens} tokens, "
        f"{len(probe.prompt_lengths)} prompt lengths; {args.repeats} rounds"
    )
    with Progress(
        TextColumn("profiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("profiling", total=None)
        try:
            times = asyncio.run(
                measure_engine(
                    probe, out, on_step=lambda done, total: progress.update(task, completed=done, total=total)
                )
            )
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
