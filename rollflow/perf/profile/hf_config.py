"""A Hugging Face `config.json` -> the shape the profiler measures and the simulator simulates.

Only decoder-only architectures whose layer is the Llama block (RMSNorm, fused QKV with rotary
embeddings, gated SiLU MLP) are accepted: those are the operators the profiler times, so any
other architecture would get a table that silently describes a different model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rollflow.errors import UserError
from rollflow.perf.specs import ModelSpec

LLAMA_BLOCK_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True, kw_only=True)
class ProfiledModel(ModelSpec):
    """The simulator's model shape (Vidur's table columns) plus what timing a real layer needs."""

    rms_norm_eps: float
    max_position_embeddings: int


def load_model_config(path: str | Path) -> ProfiledModel:
    """Read and check `config.json`; every problem is a one-line UserError naming the key."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        raw = json.loads(file.read_text())
    except FileNotFoundError:
        raise UserError(f"model config not found: {file}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"model config {file} is not JSON: {exc}") from None
    architectures = raw.get("architectures") or []
    if len(architectures) != 1 or architectures[0] not in LLAMA_BLOCK_ARCHITECTURES:
        raise UserError(
            f"model config: architectures: unknown architecture {architectures!r}; "
            f"allowed: {', '.join(LLAMA_BLOCK_ARCHITECTURES)}"
        )

    def field(key: str) -> int:
        value = raw.get(key)
        if not isinstance(value, int) or value < 1:
            raise UserError(f"model config: {key}: must be a positive integer, got {value!r}")
        return value

    hidden, heads = field("hidden_size"), field("num_attention_heads")
    kv_heads = raw.get("num_key_value_heads") or heads
    if hidden % heads:
        raise UserError(f"model config: hidden_size {hidden} does not divide by num_attention_heads {heads}")
    head_dim = raw.get("head_dim") or hidden // heads
    if head_dim != hidden // heads:
        raise UserError(
            f"model config: head_dim {head_dim} differs from hidden_size / num_attention_heads "
            f"({hidden // heads}); the simulator's model shape cannot express that"
        )
    if heads % kv_heads:
        raise UserError(
            f"model config: num_attention_heads {heads} does not divide by num_key_value_heads {kv_heads}"
        )
    return ProfiledModel(
        name=raw.get("_name_or_path") or file.parent.name,
        num_layers=field("num_hidden_layers"),
        num_q_heads=heads,
        num_kv_heads=kv_heads,
        embedding_dim=hidden,
        mlp_hidden_dim=field("intermediate_size"),
        vocab_size=field("vocab_size"),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=field("max_position_embeddings"),
    )


def model_shape_section(model: ModelSpec) -> dict[str, int]:
    """The simulator's `cluster.model_shape` for `model`: how a profiled (or any) model is simulated."""
    return {
        "num_layers": model.num_layers,
        "num_q_heads": model.num_q_heads,
        "num_kv_heads": model.num_kv_heads,
        "embedding_dim": model.embedding_dim,
        "mlp_hidden_dim": model.mlp_hidden_dim,
        "vocab_size": model.vocab_size,
    }


def check_tensor_parallel(model: ProfiledModel, tensor_parallel: int) -> None:
    """Each shard must get whole heads and an equal slice of the MLP, as vLLM requires."""
    for key, value in (
        ("num_attention_heads", model.num_q_heads),
        ("num_key_value_heads", model.num_kv_heads),
        ("intermediate_size", model.mlp_hidden_dim),
        ("vocab_size", model.vocab_size),
    ):
        if key == "num_key_value_heads" and tensor_parallel % value == 0:
            continue  # fewer KV heads than shards: each KV head is replicated
        if value % tensor_parallel:
            raise UserError(
                f"--tp {tensor_parallel}: model config {key} {value} does not divide by the tensor-parallel size"
            )
