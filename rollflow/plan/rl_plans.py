"""The plans of an RL search: placements x policies x preemptible instances x budgets, as overrides."""

from __future__ import annotations

import itertools
from typing import Any

from rollflow.plan.rl_config import RLSearchSpace

SCHEDULING = {
    "static": {"kind": "static"},
    "dynamic": {"kind": "dynamic"},
    "pre_process": {"kind": "dynamic", "pre_process": True},
    "wait_before_last_iter": {"kind": "dynamic", "wait_before_last_iter": True},
}


def expand_plans(space: RLSearchSpace) -> list[dict[str, Any]]:
    """Every plan as knob values; combinations a placement cannot take are left out, not skipped
    (dynamic policies need a pipelined disaggregated placement; spot needs a collocated one;
    off-policy, collocated, needs spot instances to roll out while it trains; partial rollout needs
    static scheduling and no spot instances)."""
    plans = []
    for plan, bound, extra, processes in itertools.product(
        _placement_plans(space), space.off_policy, space.partial_rollout, space.manager_processes
    ):
        if bound and plan["placement"] == "collocated" and not plan["spot_instances"]:
            continue
        if extra and (plan["scheduling"] != "static" or plan["spot_instances"]):
            continue
        plans.append(plan | {"off_policy": bound, "partial_rollout": extra, "manager_processes": processes})
    return plans


def _placement_plans(space: RLSearchSpace) -> list[dict[str, Any]]:
    plans = []
    for num_gpus, placement in itertools.product(space.num_gpus, space.placement):
        if placement == "collocated":
            for spot, budget in itertools.product(space.spot_instances, space.local_budget_s):
                if spot == 0 and budget != space.local_budget_s[0]:
                    continue  # the local budget only matters with preemptible instances
                plans.append(
                    _plan(num_gpus, "collocated", None, False, "static", spot, budget if spot else None)
                )
            continue
        for split, pipelining, policy in itertools.product(space.splits, space.pipelining, space.scheduling):
            if policy != "static" and not pipelining:
                continue
            plans.append(_plan(num_gpus, "disaggregated", split.model_dump(), pipelining, policy, 0, None))
    return plans


def _plan(num_gpus, placement, split, pipelining, policy, spot, budget) -> dict[str, Any]:
    return {
        "num_gpus": num_gpus,
        "placement": placement,
        "actor_gpus": split["actor"] if split else None,
        "inference_gpus": split["inference"] if split else None,
        "pipelining": pipelining,
        "scheduling": policy,
        "spot_instances": spot,
        "local_budget_s": budget,
    }


def plan_config(base: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """The `rollflow rl-sim run` config of a plan (a plain dict)."""
    import json

    raw = json.loads(json.dumps(base))
    raw["num_gpus"] = plan["num_gpus"]
    placement: dict[str, Any] = {"kind": plan["placement"]}
    if plan["placement"] == "disaggregated":
        actor, inference = plan["actor_gpus"], plan["inference_gpus"]
        rollout_end = plan["num_gpus"] - inference  # rollout gets the GPUs between actor and inference
        placement |= {
            "actor": _range(0, actor),
            "rollout": _range(actor, rollout_end),
            "pipelining": plan["pipelining"],
        }
        if inference:
            placement["inference"] = _range(rollout_end, plan["num_gpus"])
    raw["placement"] = placement
    raw["scheduling"] = SCHEDULING[plan["scheduling"]]
    spot = raw.setdefault("spot", {})
    spot["instances"] = plan["spot_instances"]
    if plan["local_budget_s"] is not None:
        spot.setdefault("offload", {})["initial_budget_s"] = plan["local_budget_s"]
    raw["off_policy"] = plan["off_policy"]
    raw["partial_rollout"] = plan.get("partial_rollout", 0)
    raw.setdefault("manager", {})["processes"] = plan.get("manager_processes", 0)
    raw.pop("compare", None)
    return raw


def _range(start: int, stop: int) -> str:
    """GPUs start..stop-1 as the config writes them ('0-3'); an empty range fails validation."""
    return f"{start}-{stop - 1}"


def plan_label(plan: dict[str, Any]) -> str:
    off = f" off-policy {plan['off_policy']}" if plan.get("off_policy") else ""
    partial = f" partial +{plan['partial_rollout']}" if plan.get("partial_rollout") else ""
    manager = f" manager x{plan['manager_processes']}" if plan.get("manager_processes") else ""
    return _placement_label(plan) + off + partial + manager


def _placement_label(plan: dict[str, Any]) -> str:
    if plan["placement"] == "collocated":
        spot = (
            f" +{plan['spot_instances']} spot (budget {plan['local_budget_s']:g} s)"
            if plan["spot_instances"]
            else ""
        )
        return f"{plan['num_gpus']} GPUs collocated{spot}"
    pipe = " pipelined" if plan["pipelining"] else ""
    return (
        f"{plan['num_gpus']} GPUs actor {plan['actor_gpus']} / inference {plan['inference_gpus']}"
        f"{pipe} {plan['scheduling']}"
    )
