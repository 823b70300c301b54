"""`rollflow demo` run by the demo tests as a user runs it, in the repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.processes import REPO


def demo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`rollflow demo ARGS`, its output captured; `timeout` bounds a run that hangs."""
    return run_rollflow("demo", *args, timeout=timeout)


def dynamic_config(tmp_path: Path, model: Path, auto_scheduler: bool, lr: float) -> Path:
    """examples/demo/dynamic.yaml on the test's tiny model for three steps at learning rate `lr`, the
    auto scheduler on or off (the same run, static)."""
    raw = yaml.safe_load((REPO / "examples" / "demo" / "dynamic.yaml").read_text())
    raw["cluster"]["auto_scheduler"] = auto_scheduler
    raw["launch"]["weights"]["publish"] = str(model)
    raw["launch"]["startup_timeout_s"] = 120
    raw["launch"]["engines"][0]["model"] = str(model)
    raw["train"].update(model=str(model), steps=3, lr=lr)
    path = tmp_path / f"dynamic-{auto_scheduler}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def preemption_config(tmp_path: Path, model: Path) -> Path:
    """examples/demo/preemption.yaml on a test-sized step: one local and one spot engine on `model`,
    three steps, the spot engine preempted in step 2."""
    raw = yaml.safe_load((REPO / "examples" / "demo" / "preemption.yaml").read_text())
    raw["launch"]["weights"]["publish"] = str(model)
    raw["launch"]["startup_timeout_s"] = 120
    raw["launch"]["engines"][0].update(count=1, model=str(model))
    raw["launch"]["engines"][1]["tokenizer"] = str(model)
    raw["train"].update(
        model=str(model), steps=3, prompts_per_step=4, n_samples=4, micro_batch_groups=2, max_new_tokens=32
    )
    raw["demo"] = {"preemption": {"step": 2, "after_tokens": 8}}
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path
