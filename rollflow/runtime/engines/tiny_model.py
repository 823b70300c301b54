"""A tiny random causal LM with its own tokenizer, written to a folder that transformers and vLLM load.

Nothing comes from a model hub: the tokenizer is a byte-level BPE trained here on text that ships
with Python (module docstrings), and the weights are random (seeded). The weights are drawn with a
wider spread than a fresh model's, so the next-token distribution is peaked: greedy decoding then
has clear winners, and engines that compute the same logits in a different order (prefill vs
decode, another kernel) still agree on every argmax.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rollflow.errors import UserError

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|bos|>' + message['role'] + '\\n' + message['content'] + '<|eos|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|bos|>assistant\\n' }}{% endif %}"
)
"""ChatML's shape with this tokenizer's own specials: each turn `<|bos|>ROLE\\nCONTENT<|eos|>\\n`, and
`<|bos|>assistant\\n` to start the reply, so the reply ends where the model emits end-of-sequence.
Saved with the tokenizer (transformers 5 writes `chat_template.jinja`), where transformers'
`apply_chat_template` and vLLM's chat route read it."""


DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the model; head_dim is fixed at 64, the smallest vLLM's CPU attention supports.

    The defaults make the tiny test model; the other fields give Llama shapes of any size (16 layers,
    32 heads, 8 KV heads and an MLP of 8192 are Llama-3.2-1B's body, about 1B parameters), for
    timing engines on a GPU where the weights' values do not matter."""

    num_layers: int = 2
    # hidden size = num_heads * 64
    num_heads: int = 2
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    # std of the random weights; larger than transformers' 0.02 so logits are far apart
    init_std: float = 0.25
    seed: int = 0
    # key/value heads (grouped-query attention); None: one per attention head
    num_kv_heads: int | None = None
    # the MLP's intermediate size; None: 2 * hidden
    mlp_dim: int | None = None
    # dtype of the saved weights, one of DTYPES
    dtype: str = "float32"


def write_tiny_model(out_dir: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write config.json, model.safetensors (in `spec.dtype`) and a tokenizer to `out_dir`; return the folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if spec.vocab_size < 300:
        raise UserError(
            f"--vocab must be at least 300 (256 bytes + specials + merges), got {spec.vocab_size}"
        )
    if spec.num_layers < 1 or spec.num_heads < 1:
        raise UserError("--layers and --heads must be at least 1")
    num_kv_heads = spec.num_kv_heads or spec.num_heads
    if spec.num_heads % num_kv_heads:
        raise UserError(f"--kv-heads {num_kv_heads} must divide --heads {spec.num_heads}")
    if spec.dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {spec.dtype!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(spec.vocab_size),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=spec.max_position_embeddings,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    _name_tokenizer_class_portably(out / "tokenizer_config.json")

    hidden = 64 * spec.num_heads
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=spec.mlp_dim or 2 * hidden,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=64,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=spec.init_std,
        dtype=spec.dtype,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    model.save_pretrained(out, safe_serialization=True)
    return out


def _name_tokenizer_class_portably(path: Path) -> None:
    """transformers 5 writes its own class name; PreTrainedTokenizerFast loads in 4.x and 5.x alike."""
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS_TOKEN, EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def _corpus() -> list[str]:
    """English text that every Python install has: the docstrings of a few standard modules."""
    import argparse
    import asyncio
    import collections
    import json
    import pathlib
    import subprocess
    import threading

    texts = []
    for module in (argparse, asyncio, collections, json, pathlib, subprocess, threading):
        for name in sorted(dir(module)):
            doc = getattr(getattr(module, name), "__doc__", None)
            if isinstance(doc, str):
                texts.append(doc)
    return texts
