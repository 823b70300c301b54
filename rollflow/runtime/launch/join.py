"""A joining engine's first step: pull the newest weights into a model folder it can serve.

Pull-based, as RLBoost's engines do: the engine asks the weight server for the latest version,
so a new (spot) engine needs nothing from the trainer. Published versions carry tensors and
config files only; the tokenizer files are copied from a folder the pool names.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from rollflow.runtime.weights import WeightPuller, save_weights

# files of a Hugging Face tokenizer folder (whichever of them exist are copied)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def pull_newest_model(weights_url: str, tokenizer_dir: str | Path, out_dir: str | Path) -> int:
    """Write the newest published version plus the tokenizer to `out_dir`; returns the version."""
    out = Path(out_dir)

    async def pull():
        async with WeightPuller(weights_url, out / ".partial") as puller:
            return await puller.pull(None, "zstd")

    result = asyncio.run(pull())
    save_weights(result.weights, out)
    tokenizer = Path(tokenizer_dir)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copyfile(tokenizer / name, out / name)
    return result.weights.version
