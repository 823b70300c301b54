"""Tasks as plug-ins: where a step's prompts come from and how an answer is scored.

The config names each as "module:function":
- `reward`: (prompt_ids, output_ids, tokenizer) -> float
- `prompts`: (tokenizer, num, rng: random.Random) -> list of prompt token-id lists
- `environment` (multi-turn tasks): (prompt_ids, turns: the model's outputs so far, tokenizer) ->
  the environment's token ids to append before the next turn, or None to end the episode
Users write their own in any importable module; two toy tasks ship with rollflow: `letter_e`
(one turn) and arithmetic with a calculator tool (multi-turn).
"""

from __future__ import annotations

import importlib
import random
import re
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


# ------------------------------------------------------------------ multi-turn: arithmetic with a tool

CALL = re.compile(r"(\d{1,6})\s*([-+*])\s*(\d{1,6})")
OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def arithmetic_prompts(tokenizer: Any, num: int, rng: random.Random) -> list[list[int]]:
    """Questions 'a+b=' the model answers, calling the calculator (by writing an expression such as
    '3*4') on the way if it likes."""
    return [
        tokenizer.encode(f"{rng.randint(1, 99)}+{rng.randint(1, 99)}=", add_special_tokens=False)
        for _ in range(num)
    ]


def _answer(prompt_ids: list[int], tokenizer: Any) -> str:
    match = CALL.search(tokenizer.decode(prompt_ids))
    return str(OPERATIONS[match.group(2)](int(match.group(1)), int(match.group(3)))) if match else ""


def calculator(prompt_ids: list[int], turns: list[list[int]], tokenizer: Any) -> list[int] | None:
    """The arithmetic task's environment: the tool's answer to the first expression of the model's last
    turn (' [=12] '), or ' [?] ' when it holds none; None ends the episode, once the last turn states
    the question's answer."""
    text = tokenizer.decode(turns[-1])
    answer = _answer(prompt_ids, tokenizer)
    if answer and answer in text:
        return None
    call = CALL.search(text)
    result = f"={OPERATIONS[call.group(2)](int(call.group(1)), int(call.group(3)))}" if call else "?"
    return tokenizer.encode(f" [{result}] ", add_special_tokens=False)


def arithmetic_reward(prompt_ids: list[int], output_ids: list[int], tokenizer: Any) -> float:
    """1 when the model's own tokens (the environment's are not given to a reward) state the answer;
    else a little for each digit it wrote, so a random tiny model has a signal from the first step."""
    text = tokenizer.decode(output_ids)
    answer = _answer(prompt_ids, tokenizer)
    if answer and answer in text:
        return 1.0
    return 0.5 * sum(char.isdigit() for char in text) / max(len(text), 1)
