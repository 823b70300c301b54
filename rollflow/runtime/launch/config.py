"""The `launch:` section of a config file: what `rollflow launch up` starts and how it scales.

Other top-level sections of the same file (a trainer's, say) are left to their own readers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rollflow.config import StrictModel, load_config
from rollflow.policy.autoscale import AutoscaleSettings
from rollflow.runtime.manager.config import ManagerConfig


class Placement(StrictModel):
    """Where a process may run with `backend: ray` (ignored by the local backend)."""

    num_cpus: float = Field(1.0, ge=0)
    """CPUs the process's actor reserves on its node."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources the actor needs (e.g. {"engine_slot": 1})."""
    label_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the node must have (Ray's syntax: "v", "!v", "in(a,b)")."""


LAUNCHED_WEIGHTS = "launched"
"""`weights_url` value naming the weight server the launch itself starts (`launch.weights`)."""


class EnginePool(StrictModel):
    """`count` engines of one kind (built-in, vLLM or SGLang), serving a model folder or the newest published weights."""

    kind: Literal["local", "remote", "spot"] = "local"
    """The manager's engine kind (local, remote, spot); with `backend: ray`, spot pools go to nodes
    labelled preemptible."""
    count: int = Field(1, ge=0)
    """Engines of this pool started at launch."""
    model: str | None = None
    """Model folder every engine of the pool serves (weight version 0)."""
    weights_url: str | None = None
    """Weight server (`rollflow weights serve`): each engine pulls the newest version, then serves it.
    "launched" names the one this launch starts (`launch.weights`)."""
    tokenizer: str | None = None
    """Folder holding the tokenizer files, copied next to pulled weights (published versions carry none)."""
    server: Literal["builtin", "vllm", "sglang"] = "builtin"
    """What serves: rollflow's built-in CPU engine, vLLM's OpenAI server (started in dev mode, for
    weight reloads), or SGLang's server. The manager talks to each through its own client."""
    python: str | None = None
    """vllm / sglang: an interpreter that has the server installed (default: this one)."""
    args: list[str] = Field(default_factory=list)
    """Extra arguments for the server's command line (e.g. [--dtype, float32] for vLLM on a CPU)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for the server (e.g. VLLM_CPU_KVCACHE_SPACE: "1")."""
    capacity: int = Field(16, ge=1)
    """Most samples in flight on one engine (the manager queues the rest)."""
    threads: int = Field(1, ge=1)
    """torch CPU threads per built-in engine."""
    placement: Placement = Placement()
    """Ray placement; spot pools without a label_selector go to nodes labelled preemptible."""

    @model_validator(mode="after")
    def _one_source(self) -> EnginePool:
        if (self.model is None) == (self.weights_url is None):
            raise ValueError("set exactly one of model (a folder) and weights_url (a weight server)")
        if self.weights_url is not None and self.tokenizer is None:
            raise ValueError("weights_url needs tokenizer: a folder with the model's tokenizer files")
        return self


class WeightServerSection(StrictModel):
    """A weight server started with the manager, so joining engines can pull the newest version.

    Its store (work_dir/weight_store) belongs to the launch: it starts empty every time."""

    enabled: bool = False
    """Starts the weight server; pools with `weights_url: launched` need it."""
    port: int = Field(0, ge=0, le=65535)
    """0 picks a free port."""
    publish: str | None = None
    """Checkpoint folder published as version 0 at start: pulling engines need a version to join on."""
    keep_versions: int = Field(4, ge=1)
    """Newest versions the server keeps (deltas need the engines' current one)."""
    mooncake: Literal["tcp", "rdma"] | None = None
    """Also serve payload chunks over Mooncake's transfer engine with this protocol (`--mooncake`), for
    a trainer with `weights_transport: mooncake`; None: HTTP only."""
    placement: Placement = Placement()
    """Where the weight server's actor runs (backend ray)."""


class TrainerSection(StrictModel):
    command: list[str] = Field(min_length=1)
    """Argv of the trainer; it finds the manager in $ROLLFLOW_MANAGER_URL (and the launched weight
    server in $ROLLFLOW_WEIGHTS_URL). Its exit ends the launch."""
    placement: Placement = Placement()
    """Where the trainer's actor runs (backend ray)."""


class AutoscaleSection(StrictModel):
    """After each step the trainer reports (POST /step_report with rollout_s), engines are added or removed."""

    enabled: bool = False
    """Scale the engines from step reports; off: the pools keep their counts."""
    target_rollout_s: float = Field(60.0, gt=0)
    """Rollout time per step aimed at: a slower rollout adds engines."""
    min_engines: int = Field(1, ge=0)
    """Fewest engines kept."""
    max_engines: int = Field(8, ge=1)
    """Most engines started."""
    scale_down_below: float = Field(0.5, gt=0, le=1)
    """Remove idle engines only when a rollout took less than this fraction of the target."""
    pool: int = Field(0, ge=0)
    """Index in `engines` of the pool whose settings new engines copy (kind, model or weights)."""
    poll_interval_s: float = Field(1.0, gt=0)
    """How often the launcher checks its processes and, with autoscale on, the manager's step reports."""

    @model_validator(mode="after")
    def _consistent(self) -> AutoscaleSection:
        self.settings()
        return self

    def settings(self) -> AutoscaleSettings:
        """The policy's settings; their own check runs at validation, so a bad value names the key."""
        return AutoscaleSettings(
            self.target_rollout_s, self.min_engines, self.max_engines, self.scale_down_below
        )


class RaySection(StrictModel):
    address: str = "auto"
    """Ray cluster to join (`ray start --head` prints it), e.g. 127.0.0.1:6379."""
    node_ip_address: str | None = None
    """This driver's address as Ray sees it (127.0.0.1 keeps a one-machine cluster on loopback)."""
    preemptible_label: str = "rollflow.io/preemptible"
    """Node label marking preemptible nodes (value "true"); spot pools are placed on them."""
    manager_placement: Placement = Placement()
    """Where the manager's actor runs."""
    actor_start_timeout_s: float = Field(300.0, gt=0)
    """How long an actor may take to start on a cluster that has room for it (a busy node starts its
    Python worker slowly); one that no node has room for fails after 60 s, naming what is short."""
    relays: bool = True
    """Start a `rollflow manager relay` on every node that runs engines (one actor per node) and
    register each engine with its node's relay: the node's tokens reach the manager merged, once a
    `manager.stream_flush_ms`, and no process parses every token of the cluster."""


class LaunchSection(StrictModel):
    backend: Literal["local", "ray"] = "local"
    """local: processes on this machine; ray: each process in a Ray actor on a cluster node."""
    ray: RaySection = RaySection()
    """backend ray: the cluster to join and where the manager runs."""
    work_dir: str = "outputs/launch"
    """Logs, the manager's config and pulled weights go here (on each node, with Ray)."""
    manager: ManagerConfig = ManagerConfig(port=0)
    """The manager's own config; port 0 picks a free port. Engines are registered by the launcher."""
    weights: WeightServerSection = WeightServerSection()
    """A weight server this launch starts (`weights_url: launched` in an engine pool names it)."""
    engines: list[EnginePool] = Field(default_factory=list)
    """Engine pools, started in order and registered with the manager."""
    trainer: TrainerSection | None = None
    """A trainer command run once everything answers; its exit ends the launch. Unset: the launch runs until
    interrupted."""
    autoscale: AutoscaleSection = AutoscaleSection()
    """Engines added or removed after each step from the trainer's step reports."""
    startup_timeout_s: float = Field(300.0, gt=0)
    """How long a process may take to answer /health before the launch fails."""

    @model_validator(mode="after")
    def _checks(self) -> LaunchSection:
        if self.backend == "local" and self.manager.host != "127.0.0.1":
            raise ValueError("the local backend runs the manager on 127.0.0.1 only")
        if self.manager.engines:
            raise ValueError("list engines under launch.engines, not launch.manager.engines")
        for index, pool in enumerate(self.engines):
            if pool.weights_url == LAUNCHED_WEIGHTS and not self.weights.enabled:
                raise ValueError(f"engines.{index}.weights_url: 'launched' needs weights.enabled: true")
        if self.autoscale.enabled and self.autoscale.pool >= len(self.engines):
            raise ValueError(f"autoscale.pool {self.autoscale.pool} names no entry of engines")
        return self


class LaunchFile(StrictModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    launch: LaunchSection
    """Everything `rollflow launch up` starts; other top-level sections of the file (a demo's `train:`, say)
    are left to their readers."""


def load_launch_config(path: str | Path | None, overrides: list[str] = ()) -> LaunchSection:
    """The launch section of `path` with `launch.x=y` overrides applied."""
    return load_config(LaunchFile, path, overrides).launch
