"""`rollflow profile ...`: measure operators on this machine and write tables `rollflow sim` reads
(`rollflow profile engine`, which measures a running engine, is rollflow/runtime/engines/profiler/cli.py)."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_command, profiling_progress

EXAMPLES = """examples:
  rollflow engine init-model models/tiny && rollflow profile ops --model-config models/tiny/config.json --device cpu --out outputs/profile/tiny --grid small
  rollflow profile ops --model-config llama7b/config.json --device cuda --out outputs/profile/llama7b --tp 1,2,4
  rollflow profile engine --url http://127.0.0.1:30000 --kind builtin --model-config models/tiny --out outputs/profile/engine
"""


def register(group: argparse.ArgumentParser) -> None:
    ops = add_command(group, "ops", _ops)
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


def _ops(args: argparse.Namespace, started_at: float) -> None:
    """time one layer's operators over a grid of shapes; write mlp.csv and attention.csv

    Time the operators of one layer of the model a Hugging Face config.json describes (random
    weights, nothing downloaded) on the present device, each tensor-parallel size as its sharded
    shapes, with warm-up and repeated timing (CUDA events on a GPU). Writes Vidur-format mlp.csv
    and attention.csv that `rollflow sim` reads with execution.kind=tables. Interrupted runs resume
    from OUT/profile_progress.jsonl.

    example: rollflow profile ops --model-config models/tiny/config.json --device cpu
    --out outputs/profile/tiny --grid small
    """
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
    heading = (
        f"profiling {model.name} on {device_name}, {settings.dtype}: {grid.size} points per tensor-parallel "
        f"size ({len(grid.num_tokens)} token counts, {len(grid.decode)} decode, {len(grid.prefill)} prefill) "
        f"x tp {args.tp} = {grid.size * len(tensor_parallel)} points, {settings.warmup} warm-up + "
        f"{settings.repeats} timed calls each"
    )
    with profiling_progress(heading) as on_point:
        result = profile_ops(model, settings, args.out, on_point=on_point)
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
