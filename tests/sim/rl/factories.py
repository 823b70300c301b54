"""Small RL configs that simulate in well under a second."""

from __future__ import annotations

from typing import Any

from rollflow.config import apply_override, validate_config
from rollflow.sim.rl.config import RLSimConfig

SMALL = {
    "steps": 1,
    "num_gpus": 8,
    "workload": {
        "num_prompts": 16,
        "samples_per_prompt": 4,
        "prompt_tokens": 128,
        "output_median_tokens": 256,
        "output_sigma": 1.0,
        "max_new_tokens": 2048,
    },
    "rollout": {"scheduler": {"kind": "sarathi", "chunk_size": 512, "batch_size_cap": 64}},
    "training": {"num_minibatches": 4},
    "output": {"progress": False, "gantt": False, "chrome_trace": False},
}

DISAGGREGATED = [
    "placement.kind=disaggregated",
    "placement.actor=0-1",
    "placement.rollout=2-5",
    "placement.inference=6-7",
]


def rl_config(*overrides: str) -> RLSimConfig:
    raw: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SMALL.items()}
    for override in overrides:
        apply_override(raw, override)
    return validate_config(RLSimConfig, raw)
