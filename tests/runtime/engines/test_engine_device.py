"""The built-in engine's device and dtype options, and init-model's Llama shapes, as a user runs them on CPU.

The cuda path is the same code with another torch device; no test needs a GPU (benchmarks/gpu runs it)."""

from __future__ import annotations

import json
import os

import pytest

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.engines.helpers import PROMPT, collect, greedy, run
from tests.runtime.engines.processes import EngineProcess


def _rollflow(*args):
    return run_rollflow(*args, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_init_model_writes_the_llama_shape_and_dtype_asked_for(tmp_path):
    proc = _rollflow(
        "engine", "init-model", str(tmp_path / "m"), "--layers", "1", "--heads", "4", "--kv-heads", "2",
        "--mlp-dim", "96", "--dtype", "bfloat16", "--init-std", "0.02",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["hidden_size"]) == (
        4,
        2,
        256,
    )
    assert config["intermediate_size"] == 96 and config["initializer_range"] == 0.02
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "m" / "model.safetensors")
    assert {str(t.dtype) for t in tensors.values()} == {"torch.bfloat16"}
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (128, 256)  # 2 KV heads of 64


def test_kv_heads_that_do_not_divide_the_heads_are_a_one_line_error(tmp_path):
    proc = _rollflow("engine", "init-model", str(tmp_path / "m"), "--heads", "4", "--kv-heads", "3")
    assert proc.returncode == 2 and "--kv-heads 3 must divide --heads 4" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(
    ("device", "says"),
    [("cuda:99", "--device cuda:99: "), ("mps", "runs on cpu or cuda"), ("gpu0", "not a torch device")],
)
def test_a_device_the_engine_cannot_use_is_a_one_line_error(tiny_model, device, says):
    proc = _rollflow("engine", "serve", "--model", str(tiny_model), "--port", "0", "--device", device)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0


def test_an_engine_in_bfloat16_generates_what_transformers_does_in_bfloat16(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    from rollflow.runtime.engines.sglang import BuiltinEngineClient

    engine = EngineProcess(tiny_model, "--dtype", "bfloat16")

    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            return await collect(client, "bf16", PROMPT, greedy(8))
        finally:
            await client.close()

    try:
        got = run(go())
    finally:
        engine.stop()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).eval()
    ids = list(PROMPT)
    with torch.inference_mode():
        for _ in range(8):
            ids.append(int(torch.argmax(model(torch.tensor([ids]), use_cache=False).logits[0, -1])))
    assert got.token_ids == ids[len(PROMPT) :]
    assert all(lp <= 0.0 for lp in got.logprobs)
