"""The engines' sampling field tables: every rollflow field has a row in each, under the name the
engine's request type gives it, and a request read back at rollflow's edge is the one sent."""

from __future__ import annotations

import dataclasses

import pytest

from rollflow.runtime.engines.base import MAX_SEED, MIN_SEED, SamplingParams
from rollflow.runtime.engines.sampling_fields import (
    SGLANG_FIELDS,
    VLLM_FIELDS,
    FieldTable,
    from_engine,
    to_engine,
)
from rollflow.runtime.engines.sglang_io import SamplingParamsBody
from rollflow.runtime.manager.edge.vllm_api import VllmSamplingParams

TABLES = {"sglang": SGLANG_FIELDS, "vllm": VLLM_FIELDS}
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


@pytest.mark.parametrize("engine", TABLES)
def test_each_table_maps_every_sampling_field_once(engine):
    """A field added to SamplingParams without a row here would never reach the engine."""
    table: FieldTable = TABLES[engine]
    assert list(table) == [field.name for field in dataclasses.fields(SamplingParams)]
    names = [row.name for row in table.values()]
    assert len(set(names)) == len(names), f"two rollflow fields share an {engine} name"


@pytest.mark.parametrize("engine", TABLES)
def test_each_table_names_fields_as_the_engine_does(engine):
    assert {row.name for row in TABLES[engine].values()} <= set(EDGE_BODIES[engine].model_fields)


@pytest.mark.parametrize("engine", TABLES)
@pytest.mark.parametrize("sampling", CASES, ids=range(len(CASES)))
def test_sampling_sent_to_an_engine_reads_back_the_same_at_its_edge(engine, sampling):
    """What a client sends, parsed as the engine's request and turned back at rollflow's edge (the
    built-in engine's SGLang body, the manager's vLLM body), is the same SamplingParams."""
    body = EDGE_BODIES[engine](**to_engine(sampling, TABLES[engine]))
    assert body.to_params() == sampling
    assert from_engine(body, TABLES[engine]) == sampling


def test_fields_at_rollflow_defaults_are_left_out_and_a_zero_seed_is_not():
    assert set(to_engine(SamplingParams(max_new_tokens=4), SGLANG_FIELDS)) == {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "ignore_eos",
    }
    assert to_engine(SamplingParams(max_new_tokens=4, seed=0), SGLANG_FIELDS)["sampling_seed"] == 0
    assert to_engine(SamplingParams(max_new_tokens=4, seed=0), VLLM_FIELDS)["seed"] == 0


def test_the_vllm_edge_reads_vllm_spellings_of_every_token_and_no_max_tokens():
    params = VllmSamplingParams(top_k=0, stop="END", max_tokens=None).to_params()
    assert (params.top_k, params.stop, params.max_new_tokens) == (-1, ("END",), 16)
