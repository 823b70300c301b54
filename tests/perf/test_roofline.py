import pytest

from rollflow.perf.memory import default_num_blocks, max_resident_requests
from rollflow.perf.roofline import roofline_operator_times
from rollflow.perf.specs import GPUS, MODELS, NODES, ParallelLayout, params_per_device

LLAMA = MODELS["meta-llama/Llama-2-7b-hf"]


def _times(gpu="a100", tp=1):
    return roofline_operator_times(LLAMA, GPUS[gpu], ParallelLayout(tp, 1), NODES["a100_dgx"], 4096, 128)


def test_small_batches_are_memory_bound_and_large_ones_compute_bound():
    linear = _times().linear_ms
    assert linear[1] == pytest.approx(linear[16], rel=0.02)  # reading the weights dominates
    assert linear[4096] / linear[2048] == pytest.approx(2.0, rel=0.05)  # FLOPs dominate


def test_decode_attention_grows_with_batch_and_context_and_gpus_rank_by_bandwidth():
    a100, h100 = _times("a100"), _times("h100")
    assert a100.decode_ms[32, 32] > a100.decode_ms[32, 8] > a100.decode_ms[8, 8]
    assert h100.decode_ms[32, 32] < a100.decode_ms[32, 32]


def test_prefill_attention_is_quadratic_in_the_chunk():
    prefill = _times().prefill
    launch = 0.005  # fixed kernel cost per call (RooflineEfficiency.kernel_launch_ms)
    ratio = (prefill.lookup(0, 2048) - launch) / (prefill.lookup(0, 1024) - launch)
    assert ratio == pytest.approx(4.0, rel=1e-6)


def test_llama7b_parameter_and_kv_budget_match_known_figures():
    assert params_per_device(LLAMA, ParallelLayout()) == pytest.approx(6.48e9, rel=0.01)
    # Vidur's planner gives Llama-2-7B on an 80 GB A100 29 full-length (4096-token) slots.
    assert max_resident_requests(LLAMA, ParallelLayout(), GPUS["a100"], 0.1, 4096) == 29
    assert default_num_blocks(LLAMA, ParallelLayout(), GPUS["a100"], 0.1, 4096, 16) == 29 * 256
