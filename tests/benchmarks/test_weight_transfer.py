"""weight_transfer's goals can fail: `mismatched` counts each element that breaks a codec's promise."""

from __future__ import annotations

import torch

from benchmarks.weight_transfer import llama_state, mismatched


def _state() -> dict[str, torch.Tensor]:
    return llama_state(hidden=64, intermediate=96, layers=1, vocab=128, seed=0)


def test_an_exact_copy_breaks_no_promise() -> None:
    state = _state()
    copy = {name: tensor.clone() for name, tensor in state.items()}
    assert mismatched(state, copy, lossless=True) == 0
    assert mismatched(state, copy, lossless=False) == 0


def test_one_flipped_bit_breaks_a_lossless_codec() -> None:
    state = _state()
    copy = {name: tensor.clone() for name, tensor in state.items()}
    copy["model.norm.weight"].view(torch.int16)[3] ^= 1
    assert mismatched(state, copy, lossless=True) == 1


def test_int8_is_held_to_its_row_bound_and_vectors_to_exactness() -> None:
    state = _state()
    name = "model.layers.0.mlp.up_proj.weight"
    copy = {key: tensor.clone() for key, tensor in state.items()}
    row_max = state[name][5].float().abs().max()
    copy[name][5, 0] = (state[name][5, 0].float() + row_max * (1 / 254 + 2**-8) * 0.5).bfloat16()
    assert mismatched(state, copy, lossless=False) == 0  # within amax_row * (1/254 + 2^-8)
    copy[name][5, 1] = (state[name][5, 1].float() + row_max * 0.05).bfloat16()
    copy["model.norm.weight"].view(torch.int16)[0] ^= 1
    assert mismatched(state, copy, lossless=False) == 2


def test_a_missing_tensor_counts_whole() -> None:
    state = _state()
    copy = {key: tensor for key, tensor in state.items() if key != "lm_head.weight"}
    assert mismatched(state, copy, lossless=True) == state["lm_head.weight"].numel()
