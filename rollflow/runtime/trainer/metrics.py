"""Per-step metrics: one CSV row (appended across resumes), TensorBoard scalars when available, a display line."""

from __future__ import annotations

import csv
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepMetrics:
    step: int  # 1-based step just finished
    weight_version: int  # version the engines run after the push
    reward_mean: float
    kl: float  # token mean of KL(policy || reference) over the output positions (algorithm.py)
    entropy: float  # token mean of the policy's entropy
    policy_loss: float
    value_loss: float
    clip_fraction: float
    samples: int  # samples trained on
    samples_rejected_stale: int  # dropped by the staleness bound
    samples_resumed: int  # samples resumed at least once: engine failure, preemption, offload, weight update
    extra_groups: int  # partial rollout: groups the step ran beside its batch (`auto`: chosen for it)
    samples_carried: int  # partial rollout: samples carried into the next step (cut off, or surplus)
    tokens_carried: int  # partial rollout: their tokens so far
    tokens: int  # generated tokens trained on
    tokens_per_s: float  # generated tokens / step time
    rollout_wait_s: float  # blocked waiting for micro-batches (the bubble)
    train_s: float  # forward, backward and optimizer steps
    update_weights_s: float  # save + every engine loading the new version
    step_time_s: float


FIELDS = [f.name for f in dataclasses.fields(StepMetrics)]


class MetricsWriter:
    def __init__(self, output_dir: Path) -> None:
        self.csv_path = output_dir / "metrics.csv"
        new = not self.csv_path.exists()
        self._file = open(self.csv_path, "a", newline="")  # noqa: SIM115 - closed in close()
        self._csv = csv.DictWriter(self._file, fieldnames=FIELDS)
        if new:
            self._csv.writeheader()
        self._tensorboard = _tensorboard_writer(output_dir / "tensorboard")

    def write(self, metrics: StepMetrics) -> None:
        row = dataclasses.asdict(metrics)
        self._csv.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()})
        self._file.flush()
        if self._tensorboard is not None:
            for name, value in row.items():
                if name != "step":
                    self._tensorboard.add_scalar(f"train/{name}", value, metrics.step)
            self._tensorboard.flush()

    def close(self) -> None:
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()


def _tensorboard_writer(folder: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.info("tensorboard is not installed; metrics go to metrics.csv only")
        return None
    return SummaryWriter(str(folder))


def describe(metrics: StepMetrics) -> str:
    return (
        f"step {metrics.step}: reward {metrics.reward_mean:.3f}  kl {metrics.kl:.4f}  "
        f"entropy {metrics.entropy:.3f}  {metrics.tokens_per_s:.0f} tok/s  "
        f"wait {metrics.rollout_wait_s:.1f}s train {metrics.train_s:.1f}s push {metrics.update_weights_s:.1f}s  "
        f"stale {metrics.samples_rejected_stale} resumed {metrics.samples_resumed}"
        + (f" carried {metrics.samples_carried}" if metrics.samples_carried else "")
    )
