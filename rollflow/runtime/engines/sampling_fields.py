"""`SamplingParams` as each engine names it: one field table per engine, read both ways.

A row maps one rollflow field onto the engine's request field (SGLang's `sampling_params` object,
vLLM's `SamplingParams` / completion fields). The clients send a field only when its value differs
from rollflow's default, so an engine that lacks an optional field is never sent it for nothing;
the fields every engine knows (`always`) are sent whatever their value. The few values that change
form on the way (tuples as JSON lists, "every token" spelt 0 or -1) do so through the small
functions named in the row. A field added to `SamplingParams` without a row in each table fails
tests/runtime/engines/test_sampling_fields.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from rollflow.runtime.engines.base import SamplingParams

VLLM_DEFAULT_MAX_TOKENS = 16
"""vLLM's `SamplingParams.max_tokens` default, for a request that leaves it out."""


def _same(value: Any) -> Any:
    return value


def _as_list(value: tuple[Any, ...]) -> list[Any]:
    """A tuple field as the JSON list engines take."""
    return list(value)


def _as_tuple(value: list[Any] | None) -> tuple[Any, ...]:
    """An engine's list (None for none) as rollflow's tuple."""
    return tuple(value or ())


def _stop_strings(value: str | list[str] | None) -> tuple[str, ...]:
    """Engines take one stop string or a list; an empty one would stop at once and is dropped."""
    strings = (value,) if isinstance(value, str) else tuple(value or ())
    return tuple(s for s in strings if s)


def _every_token_as_minus_one(top_k: int) -> int:
    """vLLM spells "keep every token" 0, SGLang -1 (0 too at rollflow's edge); rollflow -1."""
    return top_k if top_k > 0 else -1


def _vllm_max_tokens(value: int | None) -> int:
    return VLLM_DEFAULT_MAX_TOKENS if value is None else value


@dataclasses.dataclass(frozen=True)
class EngineField:
    """How one rollflow sampling field travels to and from one engine."""

    # the engine's name for the field
    name: str
    # sent even at rollflow's default (the fields every engine knows)
    always: bool = False
    # rollflow's value -> the engine's
    to_engine: Callable[[Any], Any] = _same
    # the engine's value (as its request type holds it) -> rollflow's
    from_engine: Callable[[Any], Any] = _same


FieldTable = Mapping[str, EngineField]
"""rollflow's `SamplingParams` field -> how it travels to one engine."""

SGLANG_FIELDS: FieldTable = MappingProxyType(
    {
        "max_new_tokens": EngineField("max_new_tokens", always=True),
        "temperature": EngineField("temperature", always=True),
        "top_p": EngineField("top_p", always=True),
        "top_k": EngineField("top_k", always=True, from_engine=_every_token_as_minus_one),
        "ignore_eos": EngineField("ignore_eos", always=True),
        "stop_token_ids": EngineField("stop_token_ids", to_engine=_as_list, from_engine=_as_tuple),
        "seed": EngineField("sampling_seed"),
        "stop": EngineField("stop", to_engine=_as_list, from_engine=_stop_strings),
        "min_new_tokens": EngineField("min_new_tokens"),
        "frequency_penalty": EngineField("frequency_penalty"),
        "presence_penalty": EngineField("presence_penalty"),
        "repetition_penalty": EngineField("repetition_penalty"),
        "min_p": EngineField("min_p"),
        "skip_special_tokens": EngineField("skip_special_tokens"),
        "spaces_between_special_tokens": EngineField("spaces_between_special_tokens"),
        "no_stop_trim": EngineField("no_stop_trim"),
    }
)

VLLM_FIELDS: FieldTable = MappingProxyType(
    {
        "max_new_tokens": EngineField("max_tokens", always=True, from_engine=_vllm_max_tokens),
        "temperature": EngineField("temperature", always=True),
        "top_p": EngineField("top_p", always=True),
        "top_k": EngineField("top_k", always=True, from_engine=_every_token_as_minus_one),
        "ignore_eos": EngineField("ignore_eos", always=True),
        "stop_token_ids": EngineField("stop_token_ids", to_engine=_as_list, from_engine=_as_tuple),
        "seed": EngineField("seed"),
        "stop": EngineField("stop", to_engine=_as_list, from_engine=_stop_strings),
        "min_new_tokens": EngineField("min_tokens"),
        "frequency_penalty": EngineField("frequency_penalty"),
        "presence_penalty": EngineField("presence_penalty"),
        "repetition_penalty": EngineField("repetition_penalty"),
        "min_p": EngineField("min_p"),
        "skip_special_tokens": EngineField("skip_special_tokens"),
        "spaces_between_special_tokens": EngineField("spaces_between_special_tokens"),
        "no_stop_trim": EngineField("include_stop_str_in_output"),
    }
)

_DEFAULTS = {
    field.name: field.default
    for field in dataclasses.fields(SamplingParams)
    if field.default is not dataclasses.MISSING
}


def to_engine(sampling: SamplingParams, table: FieldTable) -> dict[str, Any]:
    """The engine's request fields for `sampling` (fields at rollflow's default left out)."""
    fields: dict[str, Any] = {}
    for name, row in table.items():
        value = getattr(sampling, name)
        if row.always or value != _DEFAULTS.get(name, dataclasses.MISSING):
            fields[row.name] = row.to_engine(value)
    return fields


def from_engine(request: Any, table: FieldTable) -> SamplingParams:
    """rollflow's `SamplingParams` from an engine's request object (an edge's parsed body, whose
    attributes are the engine's field names)."""
    return SamplingParams(
        **{name: row.from_engine(getattr(request, row.name)) for name, row in table.items()}
    )
