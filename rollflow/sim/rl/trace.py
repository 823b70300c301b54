"""What one simulated RL step did, as data: the step writes a `StepTrace`, accounting reads it.

`StepResult` is what accounting makes of a trace: costs, utilization and windows per component.
`PhaseSpan` (a phase on some GPUs) comes from `rollflow.phases`, whose `PhaseTimer` a live trainer can time with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollflow.phases import PhaseSpan
from rollflow.policy.view import InstanceKind
from rollflow.sim.request import SimRequest
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.manager import ManagerCapacity
from rollflow.sim.rl.spot import SpotMarket


@dataclass
class StepResult:
    index: int
    start: float
    end: float
    paid_from: float  # the previous step's end (off-policy: after `start`); paid for from here to `end`
    rollout_end: float  # the last sample generated
    num_samples: int
    trained_tokens: int  # prompt + response tokens of every trained sample
    generated_tokens: int  # response tokens kept
    regenerated_tokens: int  # tokens generated twice because a preempted sequence restarted
    reprefill_tokens: int  # prompt + generated tokens re-prefilled by migrated sequences
    num_migrated: int  # sequences moved between instances (release, offload, preemption)
    num_preemptions: int
    preempted_sequences: int  # sequences running or queued on preempted instances
    bubble_s: float  # actor lane idle, waiting for samples, from when it could first run
    reserved_gpu_s: float
    spot_gpu_s: float
    busy_gpu_s: dict[str, float]
    windows: dict[str, tuple[float, float]]  # first start and last end per component
    cost_usd: float
    offload_budget_s: float | None
    spans: list[PhaseSpan]
    instance_windows: list[tuple[int, int, str, float, float]]  # gpu_start, gpus, kind, start, end
    minibatches: list[list[int]]  # sample ids trained by each mini-batch
    actor_sizes: list[int]  # actor GPUs of each mini-batch
    tokens_by_staleness: dict[int, int]  # response tokens per weight versions behind the trainer
    max_sample_staleness: int  # the stalest token of any sample
    extra_groups: int = 0  # partial rollout: groups run beside the batch (`auto`: chosen for this step)
    carried_samples: int = 0  # partial rollout: samples handed to the next step
    tokens_carried: int = 0  # partial rollout: their response tokens when handed on
    decode_tokens: int = 0  # tokens the engines generated (every one passes the manager's relay)
    generated_end: float = 0.0  # the last sample generated, engine side (`rollout_end`: delivered)
    manager: ManagerCapacity | None = None  # the relay processes (None: not simulated)
    manager_delay_s: float = 0.0  # how much later the last sample reached the step than it was generated
    manager_max_wait_s: float = 0.0  # the longest any sample waited for the relay
    manager_cost_usd: float = 0.0  # the relay processes' CPU cores (included in cost_usd)

    @property
    def step_time_s(self) -> float:
        return self.end - self.start

    @property
    def interval_s(self) -> float:
        """Time this step adds to the run: from the previous step's end (on-policy: its step time)."""
        return self.end - self.paid_from


@dataclass(frozen=True)
class InstanceTrace:
    """One rollout instance of a step: where, when, and the batches it ran."""

    gpu_start: int
    num_gpus: int
    kind: InstanceKind
    started_at: float
    retired_at: float | None
    batches: list[tuple[float, float, int, int, int, int]]  # as `ReplicaStats.batches`


@dataclass(frozen=True)
class StepTrace:
    config: RLSimConfig
    index: int
    start: float
    end: float
    paid_from: float
    rollout_end: float
    sync_ends: tuple[float, ...]  # when each earlier step's weights reached rollout (version i+1)
    requests: list[SimRequest]  # the step's samples, in id order
    spans: list[PhaseSpan]  # the step's own GPU work: inference, training, reshards, sync
    instances: list[InstanceTrace]
    actor_free_at: float | None  # when the actor's GPUs could first run (None: from the start)
    minibatches: list[list[int]]
    actor_sizes: list[int]
    regenerated_tokens: int
    reprefill_tokens: int
    num_migrated: int
    num_preemptions: int
    preempted_sequences: int
    spot_market: SpotMarket | None  # None without preemptible instances
    offload_budget_s: float | None
    earlier_versions: dict[int, dict[int, int]] = field(
        default_factory=dict
    )  # carried-in samples' tokens per version
    num_carried_out: int = 0  # partial rollout: samples handed to the next step
    num_tokens_carried_out: int = 0  # partial rollout: their response tokens when handed on
    manager: ManagerCapacity | None = None  # the relay processes (None: not simulated)
    manager_delay_s: float = 0.0  # the last sample's delivery after its generation
    manager_max_wait_s: float = 0.0  # the longest any sample waited for the relay
