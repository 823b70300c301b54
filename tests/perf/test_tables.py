import csv
import itertools

import numpy as np
import pytest

from rollflow.perf.predictor import ExecutionTimePredictor
from rollflow.perf.roofline import roofline_operator_times
from rollflow.perf.specs import GPUS, MODELS, NODES, ParallelLayout
from rollflow.perf.tables import (
    ATTENTION_FROM_ROOFLINE,
    LINEAR_OPS,
    ProfileTableError,
    TablePaths,
    load_operator_times,
)

LLAMA = MODELS["meta-llama/Llama-2-7b-hf"]


def _paths(vidur_data, attention_table):
    network = vidur_data / "profiling" / "network" / "a100_pairwise_nvlink"
    return TablePaths(
        str(vidur_data / "profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"),
        str(attention_table),
        str(network / "all_reduce.csv"),
        str(network / "send_recv.csv"),
    )


def _load(vidur_data, attention_table, tp=1, pp=1):
    return load_operator_times(
        _paths(vidur_data, attention_table),
        LLAMA,
        ParallelLayout(tp, pp),
        NODES["a100_pairwise_nvlink"],
        block_size=16,
        max_tokens=4096,
        max_batch_size=128,
    )


def test_linear_ops_reproduce_the_table_at_sampled_token_counts(vidur_data, attention_table):
    times = _load(vidur_data, attention_table)
    ops = (*LINEAR_OPS, "post_attention_layernorm")
    with open(_paths(vidur_data, attention_table).compute) as handle:
        rows = [r for r in csv.DictReader(handle) if r["num_tensor_parallel_workers"] == "1"]
    by_tokens = {}
    for row in rows:
        by_tokens.setdefault(int(row["num_tokens"]), []).append(
            sum(float(row[f"time_stats.{op}.median"]) for op in ops)
        )
    for tokens in (1, 64, 512, 4096):
        assert times.linear_ms[tokens] == pytest.approx(np.mean(by_tokens[tokens]), rel=1e-9)
    sampled = sorted(by_tokens)
    lo, hi = next((a, b) for a, b in itertools.pairwise(sampled) if b - a > 1)
    mid = (lo + hi) // 2
    expected = np.interp(mid, [lo, hi], [np.mean(by_tokens[lo]), np.mean(by_tokens[hi])])
    assert times.linear_ms[mid] == pytest.approx(expected, rel=1e-9)


def test_attention_grids_match_the_attention_table(vidur_data, attention_table):
    times = _load(vidur_data, attention_table)
    with open(attention_table) as handle:
        rows = [r for r in csv.DictReader(handle) if r["num_tensor_parallel_workers"] == "1"]
    decode = next(
        r
        for r in rows
        if r["is_prefill"] == "False" and r["batch_size"] == "16" and r["kv_cache_size"] == "1024"
    )
    assert times.decode_ms[16, 1024 // 64] == pytest.approx(float(decode["time_stats.attn_decode.median"]))
    prefill = next(
        r
        for r in rows
        if r["is_prefill"] == "True" and r["prefill_chunk_size"] == "512" and r["kv_cache_size"] == "1024"
    )
    assert times.prefill.lookup(1024, 512) == pytest.approx(float(prefill["time_stats.attn_prefill.median"]))


def test_tensor_parallel_adds_two_all_reduces_per_layer(vidur_data, attention_table):
    tp1 = _load(vidur_data, attention_table, tp=1)
    tp2 = _load(vidur_data, attention_table, tp=2)
    assert (tp2.linear_ms[8:] < tp1.linear_ms[8:]).mean() < 1.0  # still pays communication
    assert tp2.linear_ms[2048] < tp1.linear_ms[2048]  # but halves the matmuls at large batches


def test_predictor_composes_a_mixed_batch_like_vidur(vidur_data, attention_table):
    times = _load(vidur_data, attention_table)
    predictor = ExecutionTimePredictor(times, LLAMA, ParallelLayout())
    seconds = predictor.stage_seconds(
        num_tokens=13, decode_batch_size=3, decode_kv_sum=3 * 700, prefills=[(0, 10)]
    )
    expected_ms = 32 * (times.linear_ms[16] + times.decode_ms[3, 11] + times.prefill.lookup(0, 10))
    assert seconds == pytest.approx(expected_ms * 1e-3)


def test_decode_run_sums_to_per_iteration_times(vidur_data, attention_table):
    predictor = ExecutionTimePredictor(_load(vidur_data, attention_table), LLAMA, ParallelLayout())
    pieces = predictor.decode_run(batch_size=5, decode_kv_sum=5 * 1000 + 3, num_iterations=300)
    assert sum(c for c, _ in pieces) == 300
    per_iteration = sum(predictor.stage_seconds(5, 5, 5 * 1000 + 3 + 5 * j, []) for j in range(300))
    assert sum(c * s for c, s in pieces) == pytest.approx(per_iteration, rel=1e-12)


def test_missing_rows_name_the_model_and_sharding(vidur_data, attention_table):
    with pytest.raises(ProfileTableError, match="no rows for meta-llama/Llama-2-7b-hf at tensor_parallel=3"):
        _load(vidur_data, attention_table, tp=3)


def test_pipeline_stages_pay_a_send_recv_per_stage(vidur_data, attention_table):
    times = _load(vidur_data, attention_table, pp=2)
    assert times.send_recv_ms[512] > times.send_recv_ms[8] > 0
    predictor = ExecutionTimePredictor(times, LLAMA, ParallelLayout(1, 2))
    middle = predictor.stage_seconds(512, 0, 0, [(0, 512)], is_last_stage=False)
    last = predictor.stage_seconds(512, 0, 0, [(0, 512)], is_last_stage=True)
    assert middle - last == pytest.approx(times.send_recv_ms[512] * 1e-3)
    assert predictor.num_layers == 16


def test_without_an_attention_table_attention_comes_from_the_roofline(vidur_data, attention_table):
    roofline = roofline_operator_times(
        LLAMA, GPUS["a100"], ParallelLayout(1, 1), NODES["a100_pairwise_nvlink"], 4096, 128
    )
    from_tables = _load(vidur_data, attention_table)
    times = load_operator_times(
        _paths(vidur_data, ATTENTION_FROM_ROOFLINE),
        LLAMA,
        ParallelLayout(1, 1),
        NODES["a100_pairwise_nvlink"],
        block_size=16,
        max_tokens=4096,
        max_batch_size=128,
        gpu=GPUS["a100"],
    )
    np.testing.assert_array_equal(times.linear_ms, from_tables.linear_ms)
    np.testing.assert_array_equal(times.decode_ms, roofline.decode_ms)
    assert times.prefill.lookup(1024, 512) == roofline.prefill.lookup(1024, 512)
    assert "attention from the roofline on a100" in times.source
