"""`rollflow profile engine --kind vllm` against the real vLLM server of the integration tier."""

from __future__ import annotations

import csv
import os
import subprocess

from rollflow.runtime.launch.process import rollflow_command
from tests.factories import REPO


def test_profile_engine_measures_a_real_vllm_server(vllm_server, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        rollflow_command("profile", "engine", "--url", vllm_server.url,
            "--kind", "vllm", "--model-config", str(vllm_server.model_dir), "--out", str(tmp_path),
            "--batch-sizes", "1,4", "--prompt-lengths", "16,128", "--decode-prompt-lengths", "16,96", "--decode-tokens", "8", "--repeats", "2",
        ),
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "decode batch 4, KV " in proc.stdout and "request round trip" in proc.stdout
    with open(tmp_path / "mlp.csv", newline="") as handle:
        rows = {
            int(r["num_tokens"]): float(r["time_stats.attn_pre_proj.median"]) for r in csv.DictReader(handle)
        }
    assert sorted(rows) == [16, 128]  # tokens' cost, from the prompts
    assert all(value > 0 for value in rows.values())
    with open(tmp_path / "attention.csv", newline="") as handle:
        decode = {
            (int(r["batch_size"]), int(r["kv_cache_size"])): float(r["time_stats.attn_decode.median"])
            for r in csv.DictReader(handle)
            if r["is_prefill"] == "False"
        }
    # a row per batch size and decode prompt, at the mean KV length of its measured gaps
    assert sorted(batch for batch, _ in decode) == [1, 1, 4, 4] and all(
        value >= 0 for value in decode.values()
    )
    assert sorted(kv // 16 for batch, kv in decode if batch == 4) == [1, 6]  # 16-22 and 96-102
