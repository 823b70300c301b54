"""Tiny learning configs: two unequal replicas and a few dozen short requests simulate in milliseconds."""

from __future__ import annotations

from typing import Any

import pytest

from rollflow.config import apply_override, validate_config
from rollflow.learn.config import LearnConfig


def tiny_config(*overrides: str, **sections: Any) -> LearnConfig:
    raw: dict[str, Any] = {
        "cluster": {"groups": [{"replicas": 1, "device": "h100"}, {"replicas": 1, "device": "a40"}]},
        "workload": {
            "kind": "synthetic",
            "max_tokens": 1024,
            "lengths": {"kind": "uniform", "min_tokens": 64, "prefill_to_decode_ratio": 3.0},
            "intervals": {"kind": "gamma", "qps": 20.0, "cv": 2.0},
        },
        "scenario": {
            "episode_requests": 24,
            "imbalance_requests": 4,
            "imbalance_probability": 0.5,
            "train_seeds": [10, 11, 12],
            "eval_seeds": [1],
            "validation_seeds": [900],
            "eval_requests": 40,
            "validate_every": 1,
        },
        "reward": {"slo_e2e_s": 2.0, "slo_ttft_s": 0.5},
        "bc": {"episodes_per_demonstrator": 1, "epochs": 2},
        "ppo": {"total_steps": 64, "rollout_steps": 32, "minibatch_size": 16, "epochs": 2, "hidden": 8},
        **sections,
    }
    for override in overrides:
        apply_override(raw, override)
    return validate_config(LearnConfig, raw)


def cloning_least_tokens(config: LearnConfig) -> LearnConfig:
    """`config` with behaviour cloning from least_tokens long enough to imitate it: a policy that
    sends work to both replicas, so its picks are real choices."""
    bc = config.bc.model_copy(
        update={
            "demonstrators": ["least_tokens"],
            "episodes_per_demonstrator": 4,
            "epochs": 60,
            "batch_size": 32,
        }
    )
    return config.model_copy(update={"bc": bc})


@pytest.fixture
def config(tmp_path) -> LearnConfig:
    return tiny_config(f"output_dir={tmp_path / 'out'}")
