"""`rollflow engine init-model` and `serve` as a user runs them."""

from __future__ import annotations

import json
import os

from rollflow.runtime.launch.servers import run_rollflow


def _rollflow(*args):
    return run_rollflow(*args, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_init_model_writes_a_model_and_tokenizer_that_transformers_loads(tmp_path):
    proc = _rollflow(
        "engine", "init-model", str(tmp_path / "m"), "--layers", "1", "--heads", "1", "--vocab", "400"
    )
    assert proc.returncode == 0, proc.stderr
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["head_dim"] == 64 and config["vocab_size"] == 400
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|eos|>")
    text = "The engine streams every token."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert next(model.parameters()).dtype.is_floating_point


def test_bad_engine_arguments_are_one_line_errors(tmp_path):
    proc = _rollflow("engine", "init-model", str(tmp_path / "m"), "--vocab", "10")
    assert proc.returncode == 2 and "--vocab must be at least 300" in proc.stderr
    proc = _rollflow("engine", "serve", "--model", str(tmp_path / "none"))
    assert proc.returncode == 2 and "no config.json there" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    for flag, value, bound in (
        ("--max-running-requests", "0", "below 1"),
        ("--prefix-cache-tokens", "-1", "below 0"),
    ):
        proc = _rollflow("engine", "serve", "--model", str(tmp_path / "none"), flag, value)
        assert proc.returncode == 2 and f"argument {flag}: {value} is {bound}" in proc.stderr
