"""The compiled execution-time lookups give exactly the pure-Python reference's seconds."""

import pickle
import random

import pytest

from rollflow.native import PURE_PYTHON_ENV
from rollflow.perf import predictor as predictor_module
from rollflow.perf.predictor import ExecutionTimePredictor
from rollflow.sim.build import build_groups
from tests.compiled import require_compiled
from tests.factories import LLAMA7B_MLP, VIDUR_DATA, make_config


@pytest.fixture
def timing_core() -> None:
    """The compiled lookups, which the tests that compare them with the reference need built."""
    require_compiled("rollflow.perf._timing")


def _predictors(monkeypatch, config) -> tuple[ExecutionTimePredictor, ExecutionTimePredictor]:
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    pure = build_groups(config)[0].predictor
    monkeypatch.delenv(PURE_PYTHON_ENV)
    compiled = build_groups(config)[0].predictor
    assert not pure.compiled and compiled.compiled
    return pure, compiled


def _configs(attention_table):
    yield make_config(cluster={"model": "meta-llama/Llama-2-7b-hf"})
    yield make_config(cluster={"model": "meta-llama/Meta-Llama-3-8B", "pipeline_stages": 2})  # GQA
    yield make_config(cluster={"model": "meta-llama/Llama-2-70b-hf", "tensor_parallel": 4})
    if LLAMA7B_MLP.is_file():
        network = VIDUR_DATA / "profiling" / "network" / "a100_pairwise_nvlink"
        yield make_config(
            execution={
                "kind": "tables",
                "compute_table": str(LLAMA7B_MLP),
                "attention_table": str(attention_table),
                "all_reduce_table": str(network / "all_reduce.csv"),
                "send_recv_table": str(network / "send_recv.csv"),
            },
            cluster={"model": "meta-llama/Llama-2-7b-hf", "device": "a100", "pipeline_stages": 2},
        )


@pytest.mark.usefixtures("timing_core")
def test_compiled_lookups_equal_the_python_reference(monkeypatch, attention_table):
    rng = random.Random(7)
    for config in _configs(attention_table):
        pure, compiled = _predictors(monkeypatch, config)
        cap = config.scheduler.batch_size_cap
        for _ in range(3000):
            decode = rng.randrange(0, cap + 1)
            kv_sum = decode * rng.randrange(1, 4000) + rng.randrange(0, max(decode, 1))
            prefills = [(rng.choice((0, rng.randrange(0, 3000))), rng.randrange(1, 2048))
                        for _ in range(rng.choice((0, 0, 1, 1, 2, 5)))]  # fmt: skip
            tokens = decode + sum(chunk for _, chunk in prefills)
            if tokens == 0 or tokens > config.max_tokens:
                continue
            for last in (True, False):
                assert compiled.stage_seconds(tokens, decode, kv_sum, prefills, is_last_stage=last) == (
                    pure.stage_seconds(tokens, decode, kv_sum, prefills, is_last_stage=last)
                )
            if decode:
                iterations = rng.randrange(1, 400)
                assert compiled.decode_run(decode, kv_sum, iterations) == pure.decode_run(
                    decode, kv_sum, iterations
                )
                cached, chunk = rng.randrange(0, 2000), rng.randrange(1, 512)
                assert compiled.chunk_run(decode, kv_sum, cached, chunk, 5) == pure.chunk_run(
                    decode, kv_sum, cached, chunk, 5
                )


def test_pure_python_when_asked_or_not_built(monkeypatch):
    config = make_config()
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    assert not build_groups(config)[0].predictor.compiled
    monkeypatch.delenv(PURE_PYTHON_ENV)
    monkeypatch.setattr(predictor_module, "_noted_missing", False)
    monkeypatch.setitem(__import__("sys").modules, "rollflow.perf._timing", None)  # as if never built
    predictor = build_groups(config)[0].predictor
    assert not predictor.compiled
    assert predictor.stage_seconds.__func__ is ExecutionTimePredictor.stage_seconds


@pytest.mark.usefixtures("timing_core")
def test_a_pickled_predictor_binds_its_own_compiled_lookups(monkeypatch):
    monkeypatch.delenv(PURE_PYTHON_ENV, raising=False)  # the compiled path, even in a pure-Python run
    predictor = build_groups(make_config())[0].predictor
    copy = pickle.loads(pickle.dumps(predictor))
    assert copy.compiled
    assert copy.stage_seconds(300, 20, 20 * 900, [(64, 256)]) == predictor.stage_seconds(
        300, 20, 20 * 900, [(64, 256)]
    )
