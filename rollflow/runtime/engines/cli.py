"""`rollflow engine ...`: make a tiny model and serve it with the built-in engine."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_command, add_listen_arguments, add_secret_argument
from rollflow.runtime.engines.builtin import DEFAULT_MAX_RUNNING_REQUESTS, DEFAULT_PREFIX_CACHE_TOKENS
from rollflow.runtime.engines.tiny_model import DTYPES, TinyModelSpec, write_tiny_model
from rollflow.runtime.http import limits

EXAMPLES = """examples:
  rollflow engine init-model models/tiny
  rollflow engine init-model models/tiny-4l --layers 4 --heads 4 --vocab 1024 --seed 1
  rollflow engine init-model models/llama-1b --layers 16 --heads 32 --kv-heads 8 --mlp-dim 8192 --dtype bfloat16 --init-std 0.02
  rollflow engine serve --model models/tiny --port 30000
  rollflow engine serve --model models/llama-1b --device cuda --dtype bfloat16
  rollflow engine serve --model models/tiny --port 0 --weight-version 3 --threads 1
  rollflow engine serve --model models/tiny --port 30000 --tensor-parallel 2
"""

API_KEY_ENV = "ROLLFLOW_ENGINE_API_KEY"


def register(group: argparse.ArgumentParser) -> None:
    init = add_command(group, "init-model", _init_model)
    init.add_argument("dir", help="output folder (created if missing)")
    init.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    init.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    init.add_argument(
        "--heads", type=int, default=2, help="attention heads of size 64; hidden = 64 * heads (default 2)"
    )
    init.add_argument("--vocab", type=int, default=512, help="tokenizer vocabulary size (default 512)")
    init.add_argument("--max-len", type=int, default=2048, help="context length (default 2048)")
    init.add_argument(
        "--kv-heads", type=int, help="key/value heads (grouped-query attention; default: --heads)"
    )
    init.add_argument("--mlp-dim", type=int, help="MLP intermediate size (default 2 * hidden)")
    init.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="dtype of the saved weights (default float32)"
    )
    init.add_argument(
        "--init-std",
        type=float,
        default=TinyModelSpec.init_std,
        help=f"std of the random weights (default {TinyModelSpec.init_std}: peaked logits for tests; "
        "0.02, transformers' own, keeps a large model's activations in float16's range)",
    )

    serve = add_command(group, "serve", _serve)
    serve.add_argument("--model", required=True, help="model folder (e.g. from `rollflow engine init-model`)")
    add_listen_arguments(serve, 30000)
    serve.add_argument(
        "--weight-version", type=int, default=0, help="weight version reported at start (default 0)"
    )
    serve.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds the samplers of requests without a sampling_seed (default: a fresh random seed "
        "per engine, so two engines never return the same samples)",
    )
    serve.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    serve.add_argument(
        "--device", default="cpu", help="torch device of the model: cpu, cuda, cuda:N (default cpu)"
    )
    serve.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="dtype the model runs in (default float32)"
    )
    serve.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="stream only new tokens in each event (SGLang's flag; default: cumulative output, like SGLang)",
    )
    add_secret_argument(
        serve,
        "--api-key",
        API_KEY_ENV,
        "require 'Authorization: Bearer KEY' on every route but /health, as SGLang's --api-key does",
    )
    serve.add_argument(
        "--max-body-mb",
        type=float,
        default=64.0,
        help="largest JSON request in MiB, 413 above it (default 64); weight uploads may be as large "
        "as the model sent as float64",
    )
    limits.add_arguments(serve)
    serve.add_argument(
        "--max-running-requests",
        type=_at_least(1),
        default=DEFAULT_MAX_RUNNING_REQUESTS,
        help="requests decoding at once; later ones wait in the engine's queue, first come first served "
        f"(SGLang's flag; default {DEFAULT_MAX_RUNNING_REQUESTS})",
    )
    serve.add_argument(
        "--prefix-cache-tokens",
        type=_at_least(0),
        default=DEFAULT_PREFIX_CACHE_TOKENS,
        help="tokens of prompt-prefix KV kept for later requests that start the same way, least "
        f"recently used evicted first; 0 turns the cache off (default {DEFAULT_PREFIX_CACHE_TOKENS})",
    )
    serve.add_argument(
        "--tensor-parallel",
        type=_at_least(1),
        default=1,
        help="processes the model is split over, Megatron-style (attention heads and MLP columns; "
        "embeddings and lm_head replicated); N must divide the heads, KV heads and MLP size; with "
        "--device cuda rank r runs on the r-th GPU from it (default 1)",
    )
    serve.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def _at_least(low: int):
    """An argparse type: an integer >= `low`, else a one-line error naming the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return parse


def _init_model(args: argparse.Namespace, started_at: float) -> None:
    """write a tiny random Llama model and its tokenizer (no download)

    Write a random causal LM (Llama, head_dim 64; tiny by default, any Llama shape with the
    options) with a byte-level BPE tokenizer trained here, to a folder that transformers, vLLM and
    `rollflow engine serve` load.

    example: rollflow engine init-model models/tiny --layers 2 --heads 2 --vocab 512
    """
    spec = TinyModelSpec(
        num_layers=args.layers,
        num_heads=args.heads,
        vocab_size=args.vocab,
        max_position_embeddings=args.max_len,
        seed=args.seed,
        num_kv_heads=args.kv_heads,
        mlp_dim=args.mlp_dim,
        dtype=args.dtype,
        init_std=args.init_std,
    )
    out = write_tiny_model(args.dir, spec)
    print(f"wrote a {args.layers}-layer model with a {args.vocab}-token tokenizer to {out}")


def _serve(args: argparse.Namespace, started_at: float) -> None:
    """serve a model folder with the built-in engine (SGLang's /generate API subset)

    Serve a model on CPU or a GPU with transformers behind the part of SGLang's HTTP API that the
    rollout manager uses: /generate (streaming, logprobs, batches), /abort_request, /v1/loads,
    /get_load, /health, /health_generate, /get_model_info, /get_weight_version,
    /update_weights_from_disk, /update_weights_from_safetensors, /pause_generation,
    /continue_generation, /v1/loads, /get_load. Prints `serving on http://HOST:PORT` when ready.

    example: rollflow engine serve --model models/tiny --port 30000
    """
    import logging

    from rollflow.runtime.engines.builtin.launch import serve_engine
    from rollflow.runtime.signals import stop_on_sigterm

    stop_on_sigterm()  # the worker stops and the pull cache's temporary folder is removed
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    serve_engine(
        args.model,
        host=args.host,
        port=args.port,
        weight_version=args.weight_version,
        seed=args.seed,
        num_threads=args.threads,
        device=args.device,
        dtype=args.dtype,
        incremental_streaming_output=args.incremental_streaming_output,
        api_key=args.api_key,
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        body_limits=limits.from_arguments(args),
        max_running_requests=args.max_running_requests,
        prefix_cache_tokens=args.prefix_cache_tokens,
        tensor_parallel=args.tensor_parallel,
    )
