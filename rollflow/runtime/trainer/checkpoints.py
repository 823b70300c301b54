"""Checkpoints (policy, critic, optimizer, step) and the weight folders pushed to engines.

    output_dir/checkpoints/step_{N}/   policy (save_pretrained + tokenizer), optimizer.pt, critic.pt, state.json
                                       (fsdp: shards/ of policy, critic and optimizer, tokenizer, state.json)
    output_dir/weights/v{N}/           policy after N steps, what engines load as weight version N

A checkpoint is written to a temporary folder and renamed, so a crash never leaves a half one that
`--resume auto` would pick.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.json"


def _write_then_rename(folder: Path, write: Callable[[Path], None]) -> Path:
    """`folder` as `write` fills it: written under another name, then renamed into place."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    write(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def save_pretrained(model: Any, tokenizer: Any, folder: Path, state_dict: dict | None = None) -> Path:
    """A folder transformers, vLLM and the built-in engine load; written whole, then renamed into place.

    `state_dict`: the weights to write instead of the model's own (fsdp: gathered from the shards)."""

    def write(partial: Path) -> None:
        model.save_pretrained(partial, state_dict=state_dict)
        tokenizer.save_pretrained(partial)

    return _write_then_rename(folder, write)


def weights_folder(output_dir: Path, version: int) -> Path:
    return output_dir / "weights" / f"v{version}"


def prune_weights(output_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` pushed weight folders."""
    folders = sorted((output_dir / "weights").glob("v*"), key=lambda p: int(p.name[1:]))
    for folder in folders[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)


def save_checkpoint(
    output_dir: Path, step: int, policy: Any, tokenizer: Any, optimizer: Any, critic: Any | None, state: dict
) -> Path:
    def write(partial: Path) -> None:
        policy.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        torch.save(optimizer.state_dict(), partial / "optimizer.pt")
        if critic is not None:
            torch.save(critic.state_dict(), partial / "critic.pt")
        (partial / STATE_FILE).write_text(json.dumps({"step": step, **state}))

    return _write_then_rename(output_dir / "checkpoints" / f"step_{step}", write)


def save_sharded_checkpoint(
    output_dir: Path, step: int, tokenizer: Any, state: dict, write_shards: Callable[[Path], None]
) -> Path:
    """fsdp, rank 0: a checkpoint whose model and optimizer state `write_shards` has every rank write."""

    def write(partial: Path) -> None:
        write_shards(partial)
        tokenizer.save_pretrained(partial)
        (partial / STATE_FILE).write_text(json.dumps({"step": step, **state}))

    return _write_then_rename(output_dir / "checkpoints" / f"step_{step}", write)


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    done = [p for p in (output_dir / "checkpoints").glob("step_*") if (p / STATE_FILE).is_file()]
    done = [p for p in done if p.name.removeprefix("step_").isdigit()]
    return max(done, key=lambda p: int(p.name.removeprefix("step_")), default=None)


def clear_outputs(output_dir: Path) -> None:
    """Delete what an earlier run left (checkpoints, weights, metrics): a fresh start, not a resume."""
    for name in ("checkpoints", "weights", "tensorboard", "metrics.csv"):
        path = output_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def read_state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / STATE_FILE).read_text())
