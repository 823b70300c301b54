"""The operators of one Llama-block layer on one tensor-parallel shard, as callables to time.

Shapes follow vLLM's sharding: QKV and gate/up projections are column-parallel (each shard holds
its heads and its slice of the MLP), the output and down projections row-parallel; the
all-reduces between shards are a separate table (`all_reduce.csv`). Weights are random: time
does not depend on their values. Names match the columns of Vidur's tables.
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil
from typing import TYPE_CHECKING

from rollflow.perf.profile.hf_config import ProfiledModel

if TYPE_CHECKING:
    import torch

# Per-token operators, in the order of Vidur's mlp.csv columns.
MLP_OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
ATTENTION_OPS = ("attn_prefill", "attn_kv_cache_save", "attn_decode")


class LayerShard:
    """Random weights of one layer's shard on `device`, and builders of timed calls."""

    def __init__(self, model: ProfiledModel, tensor_parallel: int, device: str, dtype: torch.dtype) -> None:
        import torch

        self.torch = torch
        self.device, self.dtype = device, dtype
        self.head_dim = model.head_dim
        self.num_q_heads = model.num_q_heads // tensor_parallel
        self.num_kv_heads = ceil(model.num_kv_heads / tensor_parallel)
        self.eps = model.rms_norm_eps
        hidden, ffn = model.embedding_dim, model.mlp_hidden_dim // tensor_parallel
        qkv = (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim

        def weight(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=dtype) * 0.02

        self.embedding = weight(model.vocab_size // tensor_parallel, hidden)
        self.norm = torch.ones(hidden, device=device, dtype=dtype)
        self.w_qkv = weight(qkv, hidden)
        self.w_o = weight(hidden, self.num_q_heads * self.head_dim)
        self.w_gate_up = weight(2 * ffn, hidden)
        self.w_down = weight(hidden, ffn)
        self.hidden = hidden

    def mlp_calls(self, num_tokens: int) -> dict[str, Callable[[], object]]:
        """One call per per-token operator at `num_tokens` tokens."""
        torch, functional = self.torch, self.torch.nn.functional
        x = torch.randn(num_tokens, self.hidden, device=self.device, dtype=self.dtype)
        ids = torch.randint(0, self.embedding.shape[0], (num_tokens,), device=self.device)
        qkv = functional.linear(x, self.w_qkv)
        q_size, kv_size = self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]
        attn_out = torch.randn(num_tokens, q_size, device=self.device, dtype=self.dtype)
        residual = torch.randn_like(x)
        gate_up = functional.linear(x, self.w_gate_up)
        act = functional.silu(gate_up[:, : gate_up.shape[1] // 2])
        positions = torch.arange(num_tokens, device=self.device)
        cos, sin = _rope_tables(positions, self.head_dim, self.device, self.dtype)
        return {
            "emb": lambda: functional.embedding(ids, self.embedding),
            "input_layernorm": lambda: functional.rms_norm(x, (self.hidden,), self.norm, self.eps),
            "attn_pre_proj": lambda: functional.linear(x, self.w_qkv),
            "attn_rope": lambda: (_rope(q, cos, sin, self.head_dim), _rope(k, cos, sin, self.head_dim)),
            "attn_post_proj": lambda: functional.linear(attn_out, self.w_o),
            "post_attention_layernorm": lambda: functional.rms_norm(x, (self.hidden,), self.norm, self.eps),
            "mlp_up_proj": lambda: functional.linear(x, self.w_gate_up),
            "mlp_act": lambda: _silu_and_mul(gate_up),
            "mlp_down_proj": lambda: functional.linear(act, self.w_down),
            "add": lambda: x + residual,
        }

    def prefill_call(self, chunk: int, prefix: int) -> Callable[[], object]:
        """Causal attention of `chunk` new tokens over `prefix` cached ones and themselves."""
        torch = self.torch
        q = torch.randn(1, self.num_q_heads, chunk, self.head_dim, device=self.device, dtype=self.dtype)
        kv_shape = (1, self.num_kv_heads, prefix + chunk, self.head_dim)
        k = torch.randn(*kv_shape, device=self.device, dtype=self.dtype)
        v = torch.randn(*kv_shape, device=self.device, dtype=self.dtype)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = self.num_q_heads != self.num_kv_heads
        if prefix == 0:
            return lambda: sdpa(q, k, v, is_causal=True, enable_gqa=gqa)
        # query i (at position prefix + i) sees keys 0 .. prefix + i
        mask = torch.ones(chunk, prefix + chunk, device=self.device, dtype=torch.bool).tril(prefix)
        return lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=gqa)

    def decode_call(self, batch_size: int, kv_len: int) -> Callable[[], object]:
        """One new token for each of `batch_size` sequences over `kv_len` cached tokens each."""
        torch = self.torch
        q = torch.randn(batch_size, self.num_q_heads, 1, self.head_dim, device=self.device, dtype=self.dtype)
        kv_shape = (batch_size, self.num_kv_heads, kv_len, self.head_dim)
        k = torch.randn(*kv_shape, device=self.device, dtype=self.dtype)
        v = torch.randn(*kv_shape, device=self.device, dtype=self.dtype)
        gqa = self.num_q_heads != self.num_kv_heads
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)

    def kv_save_call(self, num_tokens: int, block_size: int) -> Callable[[], object]:
        """Write `num_tokens` new K and V rows into a paged cache at scattered slots."""
        torch = self.torch
        num_blocks = max(2 * (num_tokens // block_size + 1), 64)
        cache_shape = (num_blocks * block_size, self.num_kv_heads, self.head_dim)
        k_cache = torch.zeros(*cache_shape, device=self.device, dtype=self.dtype)
        v_cache = torch.zeros(*cache_shape, device=self.device, dtype=self.dtype)
        slots = torch.randperm(num_blocks * block_size, device=self.device)[:num_tokens]
        k = torch.randn(num_tokens, self.num_kv_heads, self.head_dim, device=self.device, dtype=self.dtype)
        v = torch.randn_like(k)
        return lambda: (k_cache.index_copy_(0, slots, k), v_cache.index_copy_(0, slots, v))


def _rope_tables(
    positions: torch.Tensor, head_dim: int, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    import torch

    heads = x.reshape(x.shape[0], -1, head_dim)
    first, second = heads[..., : head_dim // 2], heads[..., head_dim // 2 :]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((first * c - second * s, second * c + first * s), dim=-1).reshape(x.shape)


def _silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    import torch

    half = gate_up.shape[1] // 2
    return torch.nn.functional.silu(gate_up[:, :half]) * gate_up[:, half:]
