"""Configuration of an RL training-step simulation (`rollflow rl-sim`), validated at load time.

The rollout side reuses the serving simulator's sections (scheduler, execution, the `rl_burst`
workload), so a rollout instance batches exactly as a `rollflow sim serve` replica does.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from rollflow.perf.specs import GPUS, MODELS, NODES
from rollflow.policy.offload import OffloadConfig
from rollflow.policy.oversample import PartialRollout
from rollflow.policy.placement import ClusterConfig, parse_device_range
from rollflow.policy.resources import valid_actor_sizes
from rollflow.policy.routing import ROUTERS
from rollflow.sim.config import (
    ExecutionConfig,
    ModelShape,
    RolloutBurstWorkload,
    SchedulerConfig,
    Section,
    SimConfig,
    fill_default_kinds,
)


def parse_gpu_range(text: str) -> tuple[int, int]:
    """`"2-5"` -> (2, 4): first GPU and count, as RLinf's `component_placement` writes ranges."""
    return tuple(parse_device_range(text))


def cluster_to_sections(data: dict) -> dict:
    """RLinf's `cluster:` section as this simulator's num_gpus, placement and scheduling keys.

    A plan simulated is a plan run: the live executor reads the same section. A key set both in
    `cluster` and in its own section must agree (else one of them would be silently ignored).
    """
    try:
        cluster = ClusterConfig.model_validate(data["cluster"])
    except ValidationError:
        return data  # the `cluster` field's own validation names the key
    ranges = cluster.ranges()
    derived = {
        "num_gpus": cluster.total_devices,
        "placement": {
            "kind": "disaggregated",
            "pipelining": True,
            **{name: str(span) for name, span in ranges.items()},
        },
        "scheduling": {
            "kind": "dynamic" if cluster.auto_scheduler else "static",
            "pre_process": cluster.auto_scheduler and cluster.use_pre_process_policy,
            "wait_before_last_iter": cluster.auto_scheduler and cluster.use_wait_before_last_iter_policy,
        },
    }
    merged = dict(data)
    for key, value in derived.items():
        if not isinstance(value, dict):
            if key in data and data[key] != value:
                raise ValueError(
                    f"{key}={data[key]!r} disagrees with cluster ({key}={value!r}); set it in one place"
                )
            merged[key] = value
            continue
        given = dict(data.get(key) or {})
        for sub, sub_value in value.items():
            if sub in given and str(given[sub]) != str(sub_value):
                raise ValueError(
                    f"{key}.{sub}={given[sub]!r} disagrees with cluster ({key}.{sub}={sub_value!r}); "
                    "set it in one place"
                )
            given[sub] = sub_value
        merged[key] = given
    return merged


class RolloutConfig(Section):
    tensor_parallel: int = Field(1, ge=1)
    """GPUs per rollout instance (one serving replica each)."""
    router: Literal[tuple(ROUTERS)] = "least_tokens"  # type: ignore[valid-type]
    """How samples (and migrated sequences) are spread over rollout instances."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """Batching of each rollout instance, as in `rollflow sim serve`."""
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    """Execution-time model of each rollout instance, as in `rollflow sim serve`."""


class PlacementConfig(Section):
    kind: Literal["collocated", "disaggregated"] = "collocated"
    """collocated: every component time-shares all GPUs (rollout, then inference, then training).
    disaggregated: fixed GPU ranges per component, in the order actor, rollout, inference."""
    actor: str | None = None
    """disaggregated: actor GPUs, e.g. '0-15' (must start at GPU 0)."""
    rollout: str | None = None
    """disaggregated: rollout GPUs, right after the actor's."""
    inference: str | None = None
    """disaggregated: inference GPUs, right after rollout's; leave out to run inference on the actor's GPUs."""
    pipelining: bool = False
    """disaggregated: finished rollout groups stream into inference and training (else each waits for the last)."""


class SchedulingConfig(Section):
    kind: Literal["static", "dynamic"] = "static"
    """static: components keep their GPUs. dynamic: RLinf's auto scheduler moves GPUs within a step
    (rollout releases instances, inference releases when done, the actor grows its data-parallel size)."""
    pre_process: bool = False
    """dynamic: at step start rollout also runs on the actor's GPUs and gives them back when little work is left."""
    pre_process_threshold: float = Field(0.5, ge=0.0, le=1.0)
    """dynamic + pre_process: fraction of unfinished samples under which the actor's GPUs go back."""
    wait_before_last_iter: bool = False
    """dynamic: before its last mini-batch the actor waits for rollout and inference, then trains on every GPU."""
    release_s: float = Field(0.0, ge=0.0)
    """dynamic: seconds a rollout instance takes to hand its GPUs over (drain, free its memory). Moves run
    one at a time and the actor's next mini-batch waits for those under way, as the live executor
    applies them; `rollflow profile engine --memory-moves` measures an engine's."""
    resume_s: float = Field(0.0, ge=0.0)
    """dynamic: seconds a released instance takes to wake at step end; one after another, before the
    weight sync (`rollflow profile engine --memory-moves`)."""


class TrainingConfig(Section):
    num_minibatches: int = Field(4, ge=1)
    """Optimizer steps per training step; the global batch (prompts x samples) splits evenly into them."""
    model_parallel: int = Field(1, ge=1)
    """GPUs per actor model replica (tensor x pipeline); the data-parallel size is actor GPUs / this."""
    mfu: float = Field(0.4, gt=0.0, le=1.0)
    """Achieved fraction of peak FLOP/s when training (6 x params x tokens FLOPs)."""
    recompute: bool = False
    """Activation recomputation: one more forward pass (8 instead of 6 x params x tokens)."""
    optimizer_step_s: float = Field(0.5, ge=0.0)
    """Time of one optimizer step (per mini-batch)."""
    reshard_bytes_per_param: float = Field(16.0, ge=0.0)
    """Model-state bytes per parameter moved when the actor grows (bf16 weights + fp32 master + Adam)."""
    reshard_gb_per_s: float = Field(50.0, gt=0.0)
    """Per-GPU bandwidth at which a growing actor receives its new shard."""


class InferenceConfig(Section):
    num_models: int = Field(2, ge=0)
    """Forward passes per sample (old policy and reference log-probs: 2; no KL term: 1)."""
    mfu: float = Field(0.4, gt=0.0, le=1.0)
    """Achieved fraction of peak FLOP/s of the forward passes (2 x params x tokens FLOPs each)."""


class WeightSyncConfig(Section):
    bytes_per_param: float = Field(2.0, gt=0.0)
    """Bytes sent per parameter (bf16: 2)."""
    link_gb_per_s: float = Field(25.0, gt=0.0)
    """Actor -> disaggregated rollout bandwidth (collocated placements use the GPU's NVLink)."""
    fixed_s: float = Field(1.0, ge=0.0)
    """Per-sync overhead (gathering, engine reload)."""


class CostConfig(Section):
    on_demand_usd_per_gpu_hour: float = Field(2.5, ge=0.0)
    """Price of a reserved GPU (every GPU of `num_gpus`)."""
    spot_usd_per_gpu_hour: float = Field(1.0, ge=0.0)
    """Price of a preemptible GPU, paid while it is alive."""
    cpu_usd_per_core_hour: float = Field(0.05, ge=0.0)
    """Price of the CPU core each manager relay process keeps busy (an on-demand cloud vCPU)."""


class ManagerConfig(Section):
    processes: int = Field(0, ge=0)
    """Relay processes of the rollout manager that every generated token passes through (one CPU
    core each); 0: the manager is left out (it relays any token rate)."""
    cpu_us_per_token: float | None = Field(None, gt=0.0)
    """CPU microseconds a relay process spends per token; unset: the median over rounds of the
    manager benchmark's measurement in `results_file`."""
    results_file: str | None = None
    """The results of benchmarks/manager_overhead.py; unset: benchmarks/results/manager_overhead.json
    of the checkout rollflow runs from."""
    engine_writes: Literal["batched", "per_event"] = "batched"
    """Which measurement of the benchmark: engines writing several stream events per socket write,
    as a busy engine's events reach its socket (batched), or each event on its own (per_event)."""


class GeneratedAvailability(Section):
    kind: Literal["generated"] = "generated"
    mean_lifetime_s: float = Field(3600.0, gt=0.0)
    """Mean time a preemptible instance lives (exponential)."""
    mean_downtime_s: float = Field(600.0, gt=0.0)
    """Mean time before a preempted slot comes back (exponential)."""
    notice_s: float = Field(30.0, ge=0.0)
    """Preemption notice: the instance stops taking work this long before it goes."""


class TraceAvailability(Section):
    kind: Literal["trace"] = "trace"
    file: str
    """CSV with columns instance,start_s,end_s: each row one life of a preemptible instance."""
    notice_s: float = Field(30.0, ge=0.0)
    """Preemption notice: the instance stops taking work this long before it goes."""


AvailabilityConfig = Annotated[GeneratedAvailability | TraceAvailability, Field(discriminator="kind")]


class RolloutOffloadConfig(OffloadConfig):
    """The local-rollout time budget (`rollflow.policy.offload`, shared with the manager)."""

    initial_budget_s: float = Field(60.0, gt=0.0)


class SpotConfig(Section):
    instances: int = Field(0, ge=0)
    """Preemptible rollout instances (slots, each rollout.tensor_parallel GPUs); 0 = on-demand only."""
    availability: AvailabilityConfig = Field(default_factory=GeneratedAvailability)
    """When preemptible instances come and go: drawn (`generated`) or replayed from a file (`trace`)."""
    on_preemption: Literal["migrate", "restart"] = "migrate"
    """migrate: a preempted sequence resumes elsewhere from its generated tokens; restart: from its prompt."""
    startup_s: float = Field(30.0, ge=0.0)
    """Time from an instance coming up to serving (launch plus loading weights)."""
    link_gb_per_s: float = Field(5.0, gt=0.0)
    """Bandwidth of the end-of-step weight transfer to preemptible instances."""
    offload: RolloutOffloadConfig = Field(default_factory=RolloutOffloadConfig)
    """The time budget of the reserved instances, after which the rollout's tail moves to preemptible ones."""

    @model_validator(mode="before")
    @classmethod
    def _default_kinds(cls, data: object) -> object:
        return fill_default_kinds(data, {"availability": "generated"})


class RLOutputConfig(Section):
    dir: str = "outputs/rl"
    """Folder for summary.json, gantt.png, chrome_trace.json (and compare.json, compare.png)."""
    gantt: bool = True
    """Draw gantt.png: each GPU's component over time."""
    chrome_trace: bool = True
    """Write chrome_trace.json (open it in Perfetto or chrome://tracing)."""
    progress: bool = True
    """Show a progress bar over steps (off when not a terminal)."""


class Variant(Section):
    name: str
    """Label in the comparison table."""
    overrides: list[str] = Field(default_factory=list)
    """Dotted key=value overrides applied to this config for this variant."""


class RLSimConfig(Section):
    seed: int = 42
    """Seed of every random draw (output lengths, preemptions): the same seed gives the same run."""
    steps: int = Field(3, ge=1)
    """Training steps to simulate (each draws new output lengths; the offload budget adapts between them)."""
    off_policy: int = Field(0, ge=0)
    """Staleness bound (AReaL's `max_head_offpolicyness`): a sample may be generated on weights at most
    this many versions older than the step that trains on it. 0: on-policy, steps run one after another;
    >= 1: the next step's rollout starts as soon as this one's is done (and the bound allows), on the
    instances that are not training (collocated: only preemptible ones; disaggregated: all, each once
    the previous step's inference, training and reshards have left its GPUs, which with dynamic
    scheduling a grown actor holds until its last mini-batch)."""
    partial_rollout: PartialRollout = 0
    """Partial rollout (slime's `--partial-rollout` with over-sampling): keep this many extra
    prompts' groups generating. A step's batch is full once `workload.num_prompts` groups have
    finished; every other sample then stops, keeps the tokens it generated and carries over to the
    next step, which re-prefills its prompt plus those tokens and goes on generating on newer
    weights (each token keeps the version that made it). 0: each step generates exactly its batch.
    `auto`: each step's N is chosen from the recent groups' response lengths, more for a heavier
    tail, 0 for uniform lengths (`rollflow.policy.oversample`, as `rollflow train` chooses it)."""
    num_gpus: int = Field(8, ge=1)
    """Reserved (on-demand) GPUs."""
    model: str = "meta-llama/Meta-Llama-3-8B"
    """Model name: one of the catalog (rollflow.perf.specs.MODELS) or any name with `model_shape` set."""
    model_shape: ModelShape | None = None
    """Shape of a model that is not in the catalog."""
    device: Literal[tuple(GPUS)] = "h100"  # type: ignore[valid-type]
    """GPU type of every GPU (catalog name)."""
    network_device: Literal[tuple(NODES)] = "h100_dgx"  # type: ignore[valid-type]
    """Node type: decides GPUs per node and which network tables apply."""
    workload: RolloutBurstWorkload = Field(default_factory=RolloutBurstWorkload)
    """Prompts x samples per step and their output-length distribution (`rl_burst`)."""
    reward_s: float = Field(0.0, ge=0.0)
    """Reward latency of one finished group (rule-based: 0)."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """The rollout instances: their sharding, router and serving scheduler."""
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    """Where rollout, inference and training run: all on every GPU (collocated) or on GPU ranges of their own
    (disaggregated)."""
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    """Whether GPUs move between components within a step (RLinf's dynamic scheduling)."""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    """The actor's training: mini-batches, parallelism and speed."""
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    """The forward passes after rollout (old policy and reference log-probs)."""
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    """The end-of-step transfer of new weights to the rollout instances."""
    cost: CostConfig = Field(default_factory=CostConfig)
    """GPU prices, for the cost per token."""
    spot: SpotConfig = Field(default_factory=SpotConfig)
    """Preemptible rollout instances (RLBoost): how many, how long they live, what a preemption does."""
    manager: ManagerConfig = Field(default_factory=ManagerConfig)
    """The rollout manager's relay processes: a finished sample reaches the step once they have relayed
    its tokens (`rollflow.sim.rl.manager`)."""
    output: RLOutputConfig = Field(default_factory=RLOutputConfig)
    """What the run writes, and where."""
    compare: list[Variant] = Field(default_factory=list)
    """Policies `rollflow rl-sim compare` runs side by side on this workload."""
    cluster: ClusterConfig | None = None
    """RLinf's `cluster:` section (rollflow.policy.placement), as a live run reads it: sets num_gpus,
    placement (disaggregated, pipelined) and scheduling (auto_scheduler and its two policies)."""

    @model_validator(mode="before")
    @classmethod
    def _default_kinds(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("workload"), dict):
            data = {**data, "workload": {"kind": "rl_burst", **data["workload"]}}
        if isinstance(data, dict) and isinstance(data.get("cluster"), dict):
            data = cluster_to_sections(data)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RLSimConfig:
        if self.model_shape is None and self.model not in MODELS:
            raise ValueError(
                f"unknown model {self.model!r}; set model_shape or pick one of: {', '.join(MODELS)}"
            )
        samples = self.workload.num_prompts * self.workload.samples_per_prompt
        if samples % self.training.num_minibatches:
            raise ValueError(
                f"training.num_minibatches={self.training.num_minibatches} must divide the global batch "
                f"(workload.num_prompts x samples_per_prompt = {samples})"
            )
        placement, scheduling = self.placement, self.scheduling
        if placement.kind == "collocated":
            if self.num_gpus % self.rollout.tensor_parallel:
                raise ValueError(
                    f"num_gpus={self.num_gpus} must be a multiple of rollout.tensor_parallel={self.rollout.tensor_parallel}"
                )
            if scheduling.kind == "dynamic":
                raise ValueError("scheduling.kind=dynamic needs placement.kind=disaggregated")
        else:
            self.gpu_ranges()  # raises on bad ranges
            if self.spot.instances:
                raise ValueError(
                    "spot.instances needs placement.kind=collocated (RLBoost's reserved cluster)"
                )
            if scheduling.kind == "dynamic" and not placement.pipelining:
                raise ValueError("scheduling.kind=dynamic needs placement.pipelining=true")
        actor_gpus = self.gpu_ranges()["actor"][1]
        minibatch = samples // self.training.num_minibatches
        valid = valid_actor_sizes(self.num_gpus, self.training.model_parallel, minibatch)
        if self.cluster is not None:
            problem = self.cluster.actor_size_problem(minibatch, self.training.model_parallel)
            if problem is not None:
                raise ValueError(problem)
        if actor_gpus not in valid:
            key = "num_gpus" if placement.kind == "collocated" else "placement.actor"
            raise ValueError(
                f"{key}: the actor's {actor_gpus} GPUs is not a valid size: its data-parallel size "
                f"(GPUs / training.model_parallel={self.training.model_parallel}) must divide the "
                f"{minibatch}-sample mini-batch; valid sizes: {valid}"
            )
        names = [v.name for v in self.compare]
        if len(set(names)) != len(names):
            raise ValueError(f"compare: variant names must be unique, got {names}")
        return self

    def gpu_ranges(self) -> dict[str, tuple[int, int]]:
        """(first GPU, count) of each component; collocated: every component holds all GPUs."""
        if self.placement.kind == "collocated":
            return {"actor": (0, self.num_gpus), "rollout": (0, self.num_gpus)}
        placement = self.placement
        ranges: dict[str, tuple[int, int]] = {}
        for name in ("actor", "rollout", "inference"):
            text = getattr(placement, name)
            if text is None:
                if name != "inference":
                    raise ValueError(
                        f"placement.{name}: needed for placement.kind=disaggregated (e.g. '0-3')"
                    )
                continue
            ranges[name] = parse_gpu_range(text)
        expected = 0
        for name, (start, count) in ranges.items():
            if start != expected:
                raise ValueError(
                    f"placement.{name}: starts at GPU {start}, expected {expected} "
                    "(components are contiguous, in the order actor, rollout, inference)"
                )
            expected = start + count
        if expected > self.num_gpus:
            raise ValueError(f"placement uses GPUs 0-{expected - 1} but num_gpus={self.num_gpus}")
        if ranges["rollout"][1] % self.rollout.tensor_parallel:
            raise ValueError(
                f"placement.rollout: {ranges['rollout'][1]} GPUs is not a multiple of "
                f"rollout.tensor_parallel={self.rollout.tensor_parallel}"
            )
        return ranges

    def rollout_sim_config(self) -> SimConfig:
        """The serving-simulator config of one rollout instance."""
        return SimConfig.model_validate(
            {
                "seed": self.seed,
                "cluster": {
                    "replicas": 1,
                    "model": self.model,
                    "model_shape": self.model_shape.model_dump() if self.model_shape else None,
                    "device": self.device,
                    "network_device": self.network_device,
                    "tensor_parallel": self.rollout.tensor_parallel,
                    "router": self.rollout.router,
                },
                "scheduler": self.rollout.scheduler.model_dump(),
                "execution": self.rollout.execution.model_dump(),
                "workload": self.workload.model_dump(),
                "output": {"progress": False},
            }
        )
