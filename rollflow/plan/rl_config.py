"""Configuration of an RL plan search (`rollflow rl-sim search`), validated at load time."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollflow.config import StrictModel
from rollflow.policy.oversample import PartialRollout

POLICIES = ("static", "dynamic", "pre_process", "wait_before_last_iter")


class Split(StrictModel):
    """A disaggregated split of the reserved GPUs; rollout gets what actor and inference leave."""

    actor: int = Field(ge=1)
    """GPUs of the actor (training)."""
    inference: int = Field(0, ge=0)
    """0: inference runs on the actor's GPUs."""


class RLSearchSpace(StrictModel):
    num_gpus: list[int] = Field([8], min_length=1)
    """Reserved GPU counts tried."""
    placement: list[Literal["collocated", "disaggregated"]] = Field(["collocated"], min_length=1)
    """Placements tried."""
    splits: list[Split] = Field(default_factory=list)
    """disaggregated: actor / inference GPU counts (a split must leave rollout at least one instance)."""
    pipelining: list[bool] = Field([False, True], min_length=1)
    """disaggregated: with and without streaming finished groups into inference and training."""
    scheduling: list[Literal[POLICIES]] = Field(["static"], min_length=1)  # type: ignore[valid-type]
    """static, dynamic, pre_process (dynamic + rollout on the actor's GPUs at step start),
    wait_before_last_iter (dynamic + the actor waits to train its last mini-batch on every GPU).
    The dynamic ones need a pipelined disaggregated placement."""
    spot_instances: list[int] = Field([0], min_length=1)
    """Preemptible rollout instances (collocated placements only)."""
    local_budget_s: list[float] = Field([60.0], min_length=1)
    """Initial local-rollout time budget before the tail goes to preemptible instances."""
    off_policy: list[int] = Field([0], min_length=1)
    """Staleness bounds tried (`off_policy` of `rl-sim run`; 0: on-policy). A collocated off-policy plan
    needs preemptible instances (nothing else rolls out while it trains)."""
    manager_processes: list[int] = Field([0], min_length=1)
    """Rollout-manager relay processes tried (`manager.processes` of `rl-sim run`; 0: the manager is
    left out). Each costs a CPU core (`cost.cpu_usd_per_core_hour`) for the whole step."""
    partial_rollout: list[PartialRollout] = Field([0], min_length=1)
    """Extra prompts kept generating (`partial_rollout` of `rl-sim run`; 0: off; `auto`: chosen per
    step from the recent groups' lengths): a full batch leaves the other groups' samples to the next
    step. Tried with static scheduling without preemptible instances only."""

    @field_validator("partial_rollout", mode="before")
    @classmethod
    def _extra_prompts(cls, values: Any) -> Any:
        """One line naming the entry that is neither a count nor `auto` (pydantic would list both
        branches of the union, each as a type error)."""
        for value in values if isinstance(values, list) else ():
            if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(
                    f"{value!r} is not a number of extra prompts: give whole numbers >= 0 or auto, "
                    "e.g. [0, 8, auto]"
                )
        return values

    @model_validator(mode="after")
    def _splits_for_disaggregated(self) -> RLSearchSpace:
        if "disaggregated" in self.placement and not self.splits:
            raise ValueError(
                "splits: placement disaggregated needs at least one split (actor, inference GPUs)"
            )
        if any(n < 1 for n in self.num_gpus) or any(n < 0 for n in self.spot_instances):
            raise ValueError("num_gpus must be >= 1 and spot_instances >= 0")
        if any(n < 0 for n in self.off_policy):
            raise ValueError(f"off_policy: staleness bounds must be >= 0, got {self.off_policy}")
        if any(n < 0 for n in self.manager_processes):
            raise ValueError(f"manager_processes: process counts must be >= 0, got {self.manager_processes}")
        return self


class Budget(StrictModel):
    usd_per_hour: float | None = Field(None, gt=0.0)
    """Plans whose reserved plus preemptible GPUs cost more per hour are skipped."""


class RLSearchConfig(StrictModel):
    simulation: dict[str, Any] = Field(default_factory=dict)
    """A `rollflow rl-sim run` config (inline): model, workload shape, prices, spot availability."""
    space: RLSearchSpace = Field(default_factory=RLSearchSpace)
    """The plans tried: the cross product of these lists, less the combinations that cannot run."""
    budget: Budget = Field(default_factory=Budget)
    """Plans above the budget are skipped."""
    objective: Literal["throughput_tokens_per_s", "cost_usd_per_mtok"] = "throughput_tokens_per_s"
    """What the best plan maximises (throughput) or minimises ($ per 1M trained tokens)."""
    backend: Literal["local", "ray"] = "local"
    """local: a process pool on this machine; ray: tasks on the cluster at RAY_ADDRESS."""
    workers: int = Field(2, ge=1)
    """local: processes simulating plans at once."""
    output_dir: str = "outputs/rl_search"
    """Folder for results.csv, results.json, best.yaml, best_cluster.yaml, plans/ and the Pareto plot."""
