"""The demo's config file: a `launch:` section, a `train:` section, a `demo:` section, and for the
dynamic-scheduling demo RLinf's `cluster:` section.

The launch and train sections are exactly what `rollflow launch up` and `rollflow train` read,
so a demo config is also a template for a real run; the demo section only says when to preempt.
With `cluster:` (rollflow.policy.placement, as `rollflow rl-sim` reads it) the demo is the dynamic
one: devices move between actor and rollout within each step, and nothing is preempted.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from rollflow.config import StrictModel, load_config
from rollflow.policy.placement import ClusterConfig
from rollflow.runtime.launch.config import LaunchSection
from rollflow.runtime.trainer.config import TrainConfig


class PreemptionSection(StrictModel):
    """Which engine is killed, and when: mid-rollout, while it streams samples that have tokens."""

    step: int = Field(2, ge=1)
    """The training step during whose rollout the engine is killed."""
    pool: int | None = None
    """Index in launch.engines of the pool whose engine is killed; default: the first spot pool."""
    after_tokens: int = Field(32, ge=1)
    """Kill once the engine has generated this many tokens in that step (so samples are half-done)."""
    replace: bool = True
    """Start a new engine from the same pool after the kill; it pulls the newest weights and joins."""


class DemoSection(StrictModel):
    build_model: bool = True
    """Write a tiny random model (`rollflow engine init-model`) at train.model when that folder is missing."""
    preemption: PreemptionSection = PreemptionSection()
    """Which engine is killed, and when."""
    poll_interval_s: float = Field(0.1, gt=0)
    """How often the engines' state is sampled for the timeline."""


class DemoFile(StrictModel):
    launch: LaunchSection
    """What `rollflow launch up` would start: the manager, the weight server, the engine pools."""
    train: TrainConfig
    """The trainer's config, as `rollflow train` reads it."""
    demo: DemoSection = DemoSection()
    """What the demo does on top: build the model, preempt an engine, sample the timeline."""
    cluster: ClusterConfig | None = None
    """RLinf's `cluster:` section: the dynamic-scheduling demo (examples/demo/dynamic.yaml)."""

    @property
    def preempted_pool(self) -> int:
        """Index in launch.engines of the pool whose engine is killed."""
        if self.demo.preemption.pool is not None:
            return self.demo.preemption.pool
        return next(i for i, pool in enumerate(self.launch.engines) if pool.kind == "spot")

    @model_validator(mode="after")
    def _preemption_fits(self) -> DemoFile:
        if self.cluster is not None:
            return self  # the dynamic demo preempts nothing
        pools = self.launch.engines
        index = self.demo.preemption.pool
        if index is None and not any(pool.kind == "spot" for pool in pools):
            raise ValueError(
                "demo.preemption.pool: launch.engines has no spot pool; name the pool to preempt"
            )
        if index is not None and index >= len(pools):
            raise ValueError(
                f"demo.preemption.pool: {index} names no entry of launch.engines ({len(pools)} pools)"
            )
        if pools[self.preempted_pool].count < 1:
            raise ValueError(f"demo.preemption.pool: pool {self.preempted_pool} starts no engine (count 0)")
        if self.demo.preemption.step > self.train.steps:
            raise ValueError(
                f"demo.preemption.step: {self.demo.preemption.step} is past the last step "
                f"(train.steps {self.train.steps})"
            )
        return self


def load_demo_config(path: str | Path, overrides: list[str] = (), output_dir: str | None = None) -> DemoFile:
    """The config with overrides; `output_dir` moves the launch's and the trainer's folders under it."""
    if output_dir is not None:
        out = Path(output_dir)
        overrides = [f"launch.work_dir={out / 'launch'}", f"train.output_dir={out / 'train'}", *overrides]
    return load_config(DemoFile, path, overrides)
