"""The engines' sampling field table (wire/base.py): every rollflow field has a row, under the name
each engine's request type gives it, and a request read back at rollflow's edge is the one sent."""

from __future__ import annotations

import dataclasses

import pytest

from rollflow.runtime.manager.edge.vllm_api import DEFAULT_MAX_TOKENS, VllmSamplingParams
from rollflow.runtime.wire.base import MAX_SEED, MIN_SEED, SAMPLING_NAMES, SamplingParams, engine_sampling
from rollflow.runtime.wire.sglang import SamplingParamsBody

COLUMNS = {"sglang": 0, "vllm": 1}  # each engine's column of SAMPLING_NAMES
# the engines' own request types as rollflow's edges spell them (SGLang's `sampling_params`,
# vLLM's `SamplingParams`); their field names are the engines'
EDGE_BODIES = {"sglang": SamplingParamsBody, "vllm": VllmSamplingParams}

CASES = [
    SamplingParams(max_new_tokens=1),
    SamplingParams(max_new_tokens=9, temperature=0.0, top_p=0.5, top_k=20, ignore_eos=True),
    SamplingParams(max_new_tokens=9, seed=0),
    SamplingParams(max_new_tokens=9, seed=MIN_SEED),
    SamplingParams(max_new_tokens=9, seed=MAX_SEED),
    SamplingParams(max_new_tokens=9, stop=("a", "b"), stop_token_ids=(1, 2)),
    SamplingParams(max_new_tokens=9, min_new_tokens=3, frequency_penalty=-0.5, presence_penalty=0.5),
    SamplingParams(max_new_tokens=9, repetition_penalty=1.2, min_p=0.05),
    SamplingParams(
        max_new_tokens=9, skip_special_tokens=False, spaces_between_special_tokens=False, no_stop_trim=True
    ),
]


def test_the_table_maps_every_sampling_field_once_per_engine():
    """A field added to SamplingParams without a row would never reach the engines."""
    assert list(SAMPLING_NAMES) == [field.name for field in dataclasses.fields(SamplingParams)]
    for engine, column in COLUMNS.items():
        names = [row[column] for row in SAMPLING_NAMES.values()]
        assert len(set(names)) == len(names), f"two rollflow fields share an {engine} name"


@pytest.mark.parametrize("engine", COLUMNS)
def test_the_table_names_fields_as_each_engine_does(engine):
    names = {row[COLUMNS[engine]] for row in SAMPLING_NAMES.values()}
    assert names <= set(EDGE_BODIES[engine].model_fields)


@pytest.mark.parametrize("engine", COLUMNS)
@pytest.mark.parametrize("sampling", CASES, ids=range(len(CASES)))
def test_sampling_sent_to_an_engine_reads_back_the_same_at_its_edge(engine, sampling):
    """What a client sends, parsed as the engine's request and turned back at rollflow's edge (the
    built-in engine's SGLang body, the manager's vLLM body), is the same SamplingParams."""
    assert EDGE_BODIES[engine](**engine_sampling(sampling, engine)).to_params() == sampling


def test_fields_at_rollflow_defaults_are_left_out_and_a_zero_seed_is_not():
    assert set(engine_sampling(SamplingParams(max_new_tokens=4), "sglang")) == {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "ignore_eos",
    }
    assert engine_sampling(SamplingParams(max_new_tokens=4, seed=0), "sglang")["sampling_seed"] == 0
    assert engine_sampling(SamplingParams(max_new_tokens=4, seed=0), "vllm")["seed"] == 0


@pytest.mark.parametrize("engine", COLUMNS)
def test_each_edge_reads_a_lone_stop_string_null_lists_and_top_k_zero_alike(engine):
    names = {name: row[COLUMNS[engine]] for name, row in SAMPLING_NAMES.items()}
    body = {names["max_new_tokens"]: 9, names["stop"]: "a", names["stop_token_ids"]: None, names["top_k"]: 0}
    assert EDGE_BODIES[engine](**body).to_params() == SamplingParams(max_new_tokens=9, stop=("a",))


def test_the_vllm_edge_drops_empty_stop_strings_and_fills_in_vllms_max_tokens():
    params = VllmSamplingParams(stop=["", "b"]).to_params()
    assert params == SamplingParams(max_new_tokens=DEFAULT_MAX_TOKENS, stop=("b",))
