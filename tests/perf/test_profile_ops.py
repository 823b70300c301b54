"""`rollflow profile ops` as a user runs it: the tiny model profiled on the CPU on the small grid."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from rollflow.perf.profile.operators import MLP_OPS
from tests.factories import LLAMA7B_MLP
from tests.perf.profiling import read_rows, run_rollflow, simulate_one_prompt

pytestmark = pytest.mark.process  # runs the CLI as a subprocess (left out of `make test-fast`)

LINEAR_OPS = tuple(op for op in MLP_OPS if op != "emb")  # every per-token operator of a layer


@pytest.fixture(scope="module")
def profile(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "tiny"
    proc = run_rollflow(
        "profile", "ops", "--model-config", str(tiny / "config.json"), "--device", "cpu",
        "--out", str(out), "--grid", "small", "--tp", "1,2", "--threads", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_profile_writes_vidur_format_tables_and_says_how_big_and_how_long(profile):
    out, proc = profile
    assert "34 points per tensor-parallel size" in proc.stderr and "= 68 points" in proc.stderr
    assert "measured 68 of 68 points in" in proc.stdout
    mlp, attention = read_rows(out / "mlp.csv"), read_rows(out / "attention.csv")
    if LLAMA7B_MLP.is_file():
        with LLAMA7B_MLP.open() as handle:
            assert list(mlp[0]) == next(csv.reader(handle))
    assert {r["num_tensor_parallel_workers"] for r in mlp} == {"1", "2"}
    assert all(r["n_head"] == "2" and r["n_embd"] == "128" and r["n_expanded_embd"] == "256" for r in mlp)
    decode = [r for r in attention if r["prefill_chunk_size"] == "0"]
    prefill = [r for r in attention if r["prefill_chunk_size"] != "0"]
    assert decode and prefill
    assert all(float(r["time_stats.attn_decode.median"]) > 0 for r in decode)
    assert all(float(r["time_stats.attn_prefill.median"]) > 0 for r in prefill)


def test_a_single_simulated_batch_takes_the_profiled_time(profile, tmp_path):
    out, _ = profile
    request = simulate_one_prompt(out, 64, tmp_path)

    [mlp] = [
        r
        for r in read_rows(out / "mlp.csv")
        if r["num_tokens"] == "64" and r["num_tensor_parallel_workers"] == "1"
    ]
    attention = [r for r in read_rows(out / "attention.csv") if r["num_tensor_parallel_workers"] == "1"]
    [prefill] = [r for r in attention if r["prefill_chunk_size"] == "64" and r["kv_cache_size"] == "0"]
    kv_save = statistics.mean(
        float(r["time_stats.attn_kv_cache_save.median"])
        for r in attention
        if max(int(r["prefill_chunk_size"]), int(r["batch_size"])) == 64
    )
    layer_ms = sum(float(mlp[f"time_stats.{op}.median"]) for op in LINEAR_OPS)
    layer_ms += float(prefill["time_stats.attn_prefill.median"]) + kv_save
    assert float(request["ttft"]) == pytest.approx(2 * layer_ms * 1e-3, rel=1e-9)


def test_an_interrupted_profile_resumes(tiny, tmp_path):
    from rollflow.perf.profile.hf_config import load_model_config
    from rollflow.perf.profile.ops import ProfileSettings, profile_ops
    from rollflow.perf.profile.progress import PROGRESS_FILE

    settings = ProfileSettings(
        device="cpu", dtype="float32", tensor_parallel=(1,), grid="small", block_size=16,
        max_model_len=2048, max_batch_size=128, max_kv_tokens=262144, warmup=3, repeats=10,
    )  # fmt: skip

    def interrupt_after_five(done, total):
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        profile_ops(load_model_config(tiny), settings, tmp_path, on_point=interrupt_after_five)
    assert not (tmp_path / "mlp.csv").exists()
    first = [json.loads(line) for line in (tmp_path / PROGRESS_FILE).read_text().splitlines()[1:]]
    assert len(first) == 5

    proc = run_rollflow(
        "profile", "ops", "--model-config", str(tiny), "--device", "cpu", "--out", str(tmp_path),
        "--grid", "small",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "measured 29 of 34 points" in proc.stdout and "(5 resumed from an earlier run)" in proc.stdout
    mlp = {int(r["num_tokens"]): r for r in read_rows(tmp_path / "mlp.csv")}
    for record in first:  # the first five points are the first five token counts, kept as measured
        _, _, num_tokens = record["point"]
        assert (
            float(mlp[num_tokens]["time_stats.mlp_up_proj.median"])
            == record["stats"]["mlp_up_proj"]["median"]
        )

    proc = run_rollflow(
        "profile", "ops", "--model-config", str(tiny), "--device", "cpu", "--out", str(tmp_path),
        "--grid", "small", "--block-size", "32",
    )  # fmt: skip
    assert proc.returncode == 2 and "holds a profile of another model or settings" in proc.stderr


@pytest.mark.parametrize(
    ("change", "args", "message"),
    [
        (
            {"architectures": ["GPT2LMHeadModel"]},
            [],
            "model config: architectures: unknown architecture ['GPT2LMHeadModel']; allowed: LlamaForCausalLM",
        ),
        (
            {},
            ["--tp", "3"],
            "--tp 3: model config num_attention_heads 2 does not divide by the tensor-parallel",
        ),
        (
            {"num_key_value_heads": 3},
            [],
            "model config: num_attention_heads 2 does not divide by num_key_value_heads 3",
        ),
        ({}, ["--device", "cuda"], None),
    ],
)
def test_bad_configs_are_one_line_errors(tiny, tmp_path, change, args, message):
    config = {**json.loads((tiny / "config.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    device = [] if "--device" in args else ["--device", "cpu"]
    proc = run_rollflow(
        "profile", "ops", "--model-config", str(tmp_path / "config.json"), *device, *args,
        "--out", str(tmp_path / "out"), "--grid", "small",
    )  # fmt: skip
    if message is None:  # --device cuda: an error here, a profile where a GPU is present
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
        message = "--device cuda: no CUDA device is present"
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"rollflow: {message}" or proc.stderr.strip().startswith(
        f"rollflow: {message}"
    )
    assert len(proc.stderr.strip().splitlines()) == 1
