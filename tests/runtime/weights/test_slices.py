"""The slice spec of tensor-parallel ranks, and the store's per-rank payloads built from it."""

from __future__ import annotations

import pytest
import torch

from rollflow.runtime.weights import WeightsError, WeightStore
from rollflow.runtime.weights.payload import chunk_file, decode_payload
from rollflow.runtime.weights.slices import check_divisible, rank_slices, shard_state


def _llama(hidden: int = 8, mlp: int = 16, vocab: int = 12) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.layers.0.self_attn.q_proj.weight": (hidden, hidden),
        "model.layers.0.self_attn.k_proj.weight": (hidden // 2, hidden),
        "model.layers.0.self_attn.o_proj.weight": (hidden, hidden),
        "model.layers.0.mlp.up_proj.weight": (mlp, hidden),
        "model.layers.0.mlp.down_proj.weight": (hidden, mlp),
        "model.layers.0.input_layernorm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def test_every_rank_holds_one_nth_and_the_parts_make_the_whole():
    state = _llama()
    shards = [shard_state(state, 4, rank) for rank in range(4)]
    for name, tensor in state.items():
        where = rank_slices(name, tuple(tensor.shape), 4, 0)
        if where is None:  # the norm: every rank holds it whole
            assert all(torch.equal(shard[name], tensor) for shard in shards)
            continue
        dim = where[0]
        assert shards[0][name].shape[dim] * 4 == tensor.shape[dim]
        assert torch.equal(torch.cat([shard[name] for shard in shards], dim=dim), tensor)
    assert rank_slices("model.layers.3.self_attn.q_proj.weight", (8, 8), 2, 1) == (0, slice(4, 8))
    assert rank_slices("model.layers.3.mlp.down_proj.weight", (8, 16), 2, 1) == (1, slice(8, 16))
    assert rank_slices("model.norm.weight", (8,), 2, 1) is None


def test_sizes_that_do_not_divide_are_named():
    assert check_divisible(4, 2, 16, 12, 2) is None
    assert (
        check_divisible(4, 2, 16, 12, 4) == "--tensor-parallel 4 must divide the model's key/value heads (2)"
    )
    with pytest.raises(ValueError, match="cannot be split in 3"):
        rank_slices("lm_head.weight", (8, 4), 3, 0)


def test_the_store_serves_each_rank_its_slices_full_and_delta(tmp_path):
    store = WeightStore(tmp_path / "store", chunk_bytes=1024)
    first = _llama()
    second = {name: t + 1 if "o_proj" in name else t for name, t in first.items()}
    store.publish(1, first)
    store.publish(2, second)
    for rank in range(2):
        full = store.manifest(2, "zstd", tp=(2, rank))
        delta = store.manifest(2, "delta+zstd", base_version=1, tp=(2, rank))
        assert full.payload_id == f"v2-zstd-tp2r{rank}" and full.tp == (2, rank)
        assert delta.payload_id == f"v2-delta-zstd-from1-tp2r{rank}" and delta.base_version == 1
        assert delta.wire_nbytes < full.wire_nbytes
        folder = store.root / "payloads" / delta.payload_id
        decoded = decode_payload(
            delta,
            lambda entry, f=folder: chunk_file(f, entry.index).read_bytes(),
            shard_state(first, 2, rank),
        )
        expected = shard_state(second, 2, rank)
        assert decoded.keys() == expected.keys()
        assert all(torch.equal(decoded[name], expected[name]) for name in expected)
    assert store.manifest(2, "zstd", tp=(1, 0)).tp is None  # one rank holds the whole model
    with pytest.raises(WeightsError, match=r"tp_rank must be in 0\.\.tp_size-1"):
        store.manifest(2, "zstd", tp=(2, 2))
    with pytest.raises(WeightsError, match="cannot be split in 3"):
        store.manifest(2, "zstd", tp=(3, 0))
