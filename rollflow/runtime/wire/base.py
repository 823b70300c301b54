"""What every request body and engine call is built on: `SamplingParams`, the one way a sample is
to be generated, which every engine client and the built-in engine take, and `Body`, the base of
every HTTP request body the manager and the built-in engine accept (sglang.py, openai.py,
builtin.py, the manager's edge/protocol.py). The wire types sit below the engines, the OpenAI
layer and the manager, as SGLang's io_struct.py does."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

MAX_TOKEN_ID = 2**31 - 1
"""Token ids above this fit no vocabulary (engines index int32/int64 tensors with them)."""

# Sampling seeds an engine can honour: any 64-bit value, signed or unsigned (torch's and vLLM's
# generators take both). The manager and the built-in engine refuse others at their edge.
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to generate one sample; the same fields map onto SGLang's and vLLM's requests."""

    # tokens to generate at most
    max_new_tokens: int
    # 0 is greedy
    temperature: float = 1.0
    top_p: float = 1.0
    # -1 keeps every token
    top_k: int = -1
    # keep generating past end-of-sequence
    ignore_eos: bool = False
    # more token ids that end the sample with "stop"
    stop_token_ids: tuple[int, ...] = ()
    # seed of this sample's sampler; None lets the engine choose
    seed: int | None = None
    # strings that end the sample with "stop" once the output text holds one
    stop: tuple[str, ...] = ()
    # end-of-sequence and stop tokens cannot end the sample before this many tokens
    min_new_tokens: int = 0
    # OpenAI-style penalties on tokens generated so far: frequency scales with the count,
    # presence applies once; repetition (CTRL-style) divides positive logits, multiplies negative ones
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # drop tokens less likely than min_p times the most likely one; 0 keeps all
    min_p: float = 0.0
    # how the answer's text is decoded; token ids always hold every token
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # keep the matched stop string at the end of the text
    no_stop_trim: bool = False


# SamplingParams' fields under SGLang's `sampling_params` names and vLLM's completion names: one
# table for both engines' translations. The first five always go out; any other field only when it
# differs from its default, so an engine that lacks a field is never sent it for nothing.
SAMPLING_NAMES: dict[str, tuple[str, str]] = {
    "max_new_tokens": ("max_new_tokens", "max_tokens"),
    "temperature": ("temperature", "temperature"),
    "top_p": ("top_p", "top_p"),
    "top_k": ("top_k", "top_k"),
    "ignore_eos": ("ignore_eos", "ignore_eos"),
    "stop_token_ids": ("stop_token_ids", "stop_token_ids"),
    "seed": ("sampling_seed", "seed"),
    "stop": ("stop", "stop"),
    "min_new_tokens": ("min_new_tokens", "min_tokens"),
    "frequency_penalty": ("frequency_penalty", "frequency_penalty"),
    "presence_penalty": ("presence_penalty", "presence_penalty"),
    "repetition_penalty": ("repetition_penalty", "repetition_penalty"),
    "min_p": ("min_p", "min_p"),
    "skip_special_tokens": ("skip_special_tokens", "skip_special_tokens"),
    "spaces_between_special_tokens": ("spaces_between_special_tokens", "spaces_between_special_tokens"),
    "no_stop_trim": ("no_stop_trim", "include_stop_str_in_output"),
}
ALWAYS_SENT = frozenset(("max_new_tokens", "temperature", "top_p", "top_k", "ignore_eos"))
_SAMPLING_FIELDS = tuple((field.name, field.default) for field in fields(SamplingParams))


Engine = Literal["sglang", "vllm"]
_COLUMNS: dict[Engine, int] = {"sglang": 0, "vllm": 1}  # each engine's column of SAMPLING_NAMES


def engine_sampling(sampling: SamplingParams, engine: Engine) -> dict[str, Any]:
    """`sampling` under `engine`'s field names (SGLang's `sampling_params`, vLLM's completion fields)."""
    column = _COLUMNS[engine]
    params: dict[str, Any] = {}
    for name, default in _SAMPLING_FIELDS:
        value = getattr(sampling, name)
        if name in ALWAYS_SENT or value != default:
            params[SAMPLING_NAMES[name][column]] = list(value) if isinstance(value, tuple) else value
    return params


def edge_sampling(body: Any, engine: Engine, **given: Any) -> SamplingParams:
    """The other way: the SamplingParams that an edge body spelled as `engine`'s request type (its
    attributes under `engine`'s field names) asks for. A lone stop string is a list of one, empty
    stop strings are dropped, a null list is empty and top_k 0 keeps every token (-1), as both
    engines read them; `given` sets the fields the edge decides itself (a default of its own)."""
    column = _COLUMNS[engine]
    values = {name: getattr(body, names[column]) for name, names in SAMPLING_NAMES.items()}
    stop = values["stop"]
    values["stop"] = tuple(s for s in ((stop,) if isinstance(stop, str) else stop or ()) if s)
    values["stop_token_ids"] = tuple(values["stop_token_ids"] or ())
    if values["top_k"] == 0:
        values["top_k"] = -1
    return SamplingParams(**(values | given))


def _integral(value: Any) -> Any:
    """An integral float (8.0) as the int it is: SGLang runs on Python numbers and takes it."""
    return int(value) if type(value) is float and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_integral)]
"""A count or id field: a JSON integer, or an integral float such as 8.0; never a string or bool."""


class Body(BaseModel):
    """A request body. Unknown fields are a 400 naming them; types are strict: a string is never
    read as a number or a bool (`"8"`, `"yes"` are a 400 naming the field), a bool never as a
    number; a float field takes an integer, and `Int` fields take an integral float (8.0)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
