"""Tasks as plug-ins: where a step's prompts come from and how an answer is scored.

The config names each as "module:function":
- `reward`: (prompt_ids, output_ids, tokenizer) -> float
- `prompts`: (tokenizer, num, rng: random.Random) -> list of prompt token-id lists
Users write their own in any importable module; the toy task below ships with rollflow.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from typing import Any

from rollflow.errors import UserError

PROMPT_TOKENS = 4
TARGET_LETTER = "e"


def random_prompts(tokenizer: Any, num: int, rng: random.Random) -> list[list[int]]:
    """Prompts of a few random non-special tokens: the toy task needs no data set."""
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    return [[rng.choice(vocab) for _ in range(PROMPT_TOKENS)] for _ in range(num)]


def letter_e(prompt_ids: list[int], output_ids: list[int], tokenizer: Any) -> float:
    """Fraction of generated tokens whose text contains 'e': checked by a rule, never by a model.

    Dense enough that a random tiny model starts well above 0 and below 1, so the group-relative
    advantage has signal from the first step, and the rise is visible within minutes on a CPU.
    """
    if not output_ids:
        return 0.0
    return sum(TARGET_LETTER in tokenizer.decode([token]) for token in output_ids) / len(output_ids)


def load_callable(spec: str, key: str) -> Callable:
    """Import "module:function" named by config key `key`; errors name the key and what is missing."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise UserError(f"config error: {key}: expected 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"config error: {key}: cannot import {module_name!r}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(f"config error: {key}: {module_name!r} has no function {name!r}")
    return function
