"""`rollflow weights` as a user runs it: a served folder, a publish, pulls into a folder."""

from __future__ import annotations

import json
import os

import safetensors.torch

from tests.runtime.weights.factories import (
    assert_same_state,
    rollflow,
    start_server_process,
    tiny_llama,
    train_step,
)


def test_publish_then_pull_full_and_delta_into_a_checkpoint_folder(tmp_path, monkeypatch):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    first = {k: v.clone() for k, v in tiny_llama(0).items()}
    safetensors.torch.save_file(first, str(checkpoint / "model.safetensors"))
    (checkpoint / "config.json").write_text('{"model_type": "llama"}')
    env = {**os.environ, "ROLLFLOW_WEIGHTS_TOKEN": "t0ken"}
    process, url = start_server_process(tmp_path / "store", env=env)
    try:
        monkeypatch.setenv("ROLLFLOW_WEIGHTS_TOKEN", "t0ken")  # the publishes read it, the pulls need none
        published = rollflow("weights", "publish", "--url", url, "--version", "1", "--from", str(checkpoint))
        second = train_step(first, fraction=0.02, seed=1)
        safetensors.torch.save_file(second, str(tmp_path / "step2.safetensors"))
        rollflow(
            "weights",
            "publish",
            "--url",
            url,
            "--version",
            "2",
            "--from",
            str(tmp_path / "step2.safetensors"),
        )
        monkeypatch.delenv("ROLLFLOW_WEIGHTS_TOKEN")
        assert published.returncode == 0, published.stderr
        out = tmp_path / "engine"
        full = rollflow("weights", "pull", "--url", url, "--out", str(out), "--version", "1")
        assert full.returncode == 0, full.stderr
        assert_same_state(safetensors.torch.load_file(str(out / "model.safetensors")), first)
        assert json.loads((out / "config.json").read_text()) == {"model_type": "llama"}
        delta = rollflow("weights", "pull", "--url", url, "--out", str(out), "--codec", "delta+zstd")
        assert delta.returncode == 0, delta.stderr
        assert "pulled version 2 (delta+zstd over http)" in delta.stdout
        assert_same_state(safetensors.torch.load_file(str(out / "model.safetensors")), second)
        assert json.loads((out / "rollflow_weights.json").read_text()) == {"version": 2}
        missing = rollflow("weights", "pull", "--url", url, "--out", str(out), "--version", "9")
        assert missing.returncode == 2 and "weight version 9 is not in the store" in missing.stderr
        assert missing.stderr.count("\n") == 1
    finally:
        process.kill()
        process.wait()


def test_weights_help_shows_examples():
    proc = rollflow("weights", "--help")
    assert proc.returncode == 0 and "rollflow weights pull --url" in proc.stdout
