"""The best RL plan as the live trainer takes it: RLinf's `cluster:` section for `rollflow train`.

The search simulates `rollflow rl-sim run` configs; the live executor (issue 13's dynamic
scheduling) reads the same placement and policy from RLinf's `cluster:` section, the one format both
accept (`rollflow/policy/placement.py`). A pipelined disaggregated plan maps onto it key for key
(RLinf's placement streams finished groups into inference and training, as the live trainer does).
A collocated plan has no device ranges to give, and an unpipelined one is not what a live run
executes, so neither has a section.
"""

from __future__ import annotations

from typing import Any

from rollflow.policy.placement import ClusterConfig


def live_cluster_section(plan_config: dict[str, Any]) -> dict[str, Any] | None:
    """The `cluster:` section that places and schedules a live run as `plan_config` (an rl-sim
    config) simulates it; None for a collocated or unpipelined plan. Checked by the trainer's rules."""
    placement = plan_config.get("placement") or {}
    if placement.get("kind", "collocated") != "disaggregated" or not placement.get("pipelining", False):
        return None
    scheduling = plan_config.get("scheduling") or {}
    dynamic = scheduling.get("kind", "static") == "dynamic"
    components = {name: placement[name] for name in ("actor", "rollout", "inference") if placement.get(name)}
    section = {
        "num_devices": plan_config["num_gpus"],
        "component_placement": components,
        "auto_scheduler": dynamic,
        "use_pre_process_policy": dynamic and bool(scheduling.get("pre_process", False)),
        "use_wait_before_last_iter_policy": dynamic and bool(scheduling.get("wait_before_last_iter", False)),
        "device": "cuda",
    }
    ClusterConfig.model_validate(section)  # a plan the trainer would refuse is a bug here, not the user's
    return section
