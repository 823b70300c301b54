"""Stage 4: one `rollflow train` step (GRPO) on the device: rollouts from the fleet's engines through
the manager, the policy and reference model on the device (float32, AdamW), the backward and
optimizer step, then the new weights pushed to both engines (which must then serve version 1)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from benchmarks.gpu.common import Budget, Fleet, Settings, StageFailed, http_json
from benchmarks.results import Results

PHASES = ("step_time_s", "rollout_wait_s", "train_s", "update_weights_s", "tokens", "samples", "policy_loss")


def run(settings: Settings, fleet: Fleet, work: Path, budget: Budget, results: Results) -> None:
    fleet.alive()
    config = {
        "manager_url": fleet.manager.url,
        "model": str(fleet.model),
        "device": settings.device,
        "steps": 1,
        "lr": 1e-5,
        "output_dir": str(work / "train"),
        **settings.train,
    }
    (work / "train.yaml").write_text(json.dumps(config))
    budget.rollflow("train", "--config", str(work / "train.yaml"), "--resume", "never")
    with (work / "train" / "metrics.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if len(rows) != 1:
        raise StageFailed(f"metrics.csv holds {len(rows)} steps, not 1")
    step = {name: float(rows[0][name]) for name in PHASES}
    versions = [http_json(e.url + "/get_weight_version")["weight_version"] for e in fleet.engines]
    results.figures |= {"step": step, "engine_weight_versions_after": versions, "config": settings.train}
    results.table(
        "One GRPO step of rollflow train on the device (seconds)",
        ["step", "rollout wait", "train", "update weights", "tokens"],
        [[round(step[k], 3) for k in ("step_time_s", "rollout_wait_s", "train_s", "update_weights_s")]
         + [int(step["tokens"])]],
    )  # fmt: skip
    print(f"  step {step['step_time_s']:.2f} s: rollout wait {step['rollout_wait_s']:.2f}, train "
          f"{step['train_s']:.2f}, update weights {step['update_weights_s']:.2f}; engines now at "
          f"weight versions {versions}")  # fmt: skip
    results.goal("engines serving the trained weights (version 1)", min(versions), ">=", 1)
    results.goal(
        "samples trained on",
        step["samples"],
        ">=",
        settings.train["prompts_per_step"] * settings.train["n_samples"],
    )
