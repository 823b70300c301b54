"""Configuration of a serving simulation (`rollflow sim serve`), validated at load time."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rollflow.config import StrictModel
from rollflow.perf.specs import GPUS, MODELS, NODES, GpuSpec, NodeSpec
from rollflow.policy.routing import ROUTERS


def fill_default_kinds(data: object, defaults: dict[str, str]) -> object:
    """Lets a user leave out `kind` in a union section (e.g. `workload`); the documented default applies."""
    if isinstance(data, dict):
        for key, kind in defaults.items():
            section = data.get(key)
            if isinstance(section, dict) and "kind" not in section:
                data = {**data, key: {"kind": kind, **section}}
    return data


class Section(StrictModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelShape(Section):
    """A model outside the built-in catalog, described by its shape."""

    num_layers: int = Field(ge=1)
    """Transformer layers."""
    num_q_heads: int = Field(ge=1)
    """Attention query heads."""
    num_kv_heads: int = Field(ge=1)
    """Key/value heads (fewer than the query heads: grouped-query attention)."""
    embedding_dim: int = Field(ge=1)
    """Hidden size."""
    mlp_hidden_dim: int = Field(ge=1)
    """Inner size of the MLP."""
    vocab_size: int = Field(ge=1)
    """Vocabulary size (the output projection's width)."""
    use_gated_mlp: bool = True
    """Whether the MLP is gated (SwiGLU: three matrices instead of two)."""
    post_attn_norm: bool = True
    """Whether a second norm sits before the MLP (Llama-style blocks; phi-2 has none), timed as its own operation."""


class DeviceSpec(Section):
    """A GPU outside the built-in catalog: the peak numbers the roofline model divides work by
    (the fields of rollflow.perf.specs.GpuSpec), and how many GPUs share a node."""

    fp16_tflops: float = Field(gt=0.0)
    """Peak dense fp16/bf16 throughput of one GPU, in TFLOP/s."""
    memory_gb: float = Field(gt=0.0)
    """Memory of one GPU in GiB (weights and KV cache share it)."""
    hbm_gb_per_s: float = Field(gt=0.0)
    """Memory bandwidth of one GPU, in GB/s."""
    link_gb_per_s: float = Field(gt=0.0)
    """Per-GPU bandwidth of the fastest link to a peer (NVLink), in GB/s: tensor-parallel
    all-reduces and pipeline hops inside a node."""
    devices_per_node: int = Field(8, ge=1)
    """GPUs per node: a pipeline hop beyond them crosses the slower inter-node network."""

    def gpu(self, name: str) -> GpuSpec:
        return GpuSpec(name, self.fp16_tflops, self.memory_gb, self.hbm_gb_per_s, self.link_gb_per_s)


def user_node_name(device: str) -> str:
    """The node a user device brings, named as the catalog names its nodes."""
    return f"{device}_pairwise_nvlink"


class ReplicaGroup(Section):
    """Replicas that share a GPU type and sharding; a cluster may mix several groups."""

    replicas: int = Field(1, ge=1)
    """Number of replicas in this group."""
    device: str = "a100"
    """GPU type of this group's replicas: a catalog device or one of `cluster.devices`."""
    network_device: str | None = None
    """Node type of this group; default: `<device>_pairwise_nvlink`."""
    tensor_parallel: int = Field(1, ge=1)
    """GPUs per pipeline stage of this group's replicas, splitting every layer."""
    pipeline_stages: int = Field(1, ge=1)
    """Pipeline stages per replica of this group, splitting the layers."""


class AffinityConfig(Section):
    """When a cache-affine router gives up affinity for balance, as sgl-router's cache_aware does.

    An instance is overloaded, and loses its affinity, when its outstanding requests exceed the
    least loaded instance's by more than `balance_abs_threshold` and by a factor of more than
    `balance_rel_threshold`."""

    balance_abs_threshold: int = Field(16, ge=0)
    """Outstanding requests by which an instance must exceed the least loaded one to lose its affinity."""
    balance_rel_threshold: float = Field(1.5, ge=1.0)
    """Factor by which an instance's outstanding requests must exceed the least loaded one's to lose its
    affinity."""
    cache_threshold: float = Field(0.3, ge=0.0, le=1.0)
    """prefix_affinity: least fraction of the prompt cached on an instance for it to attract the request."""


class ServingClusterConfig(Section):
    """The serving cluster: replicas (of one kind, or groups of several), their GPUs and sharding, and the
    router in front of them."""

    devices: dict[str, DeviceSpec] = Field(default_factory=dict)
    """GPUs a user adds to the catalog (a100, h100, a40), by name: `device`, `groups` and a
    search's `space.device` may then name them. Each brings its node, `<name>_pairwise_nvlink`.
    With `execution.kind: tables` and no compute table of its own, its times come from the
    roofline model (the summary's execution_model says so)."""
    replicas: int = Field(1, ge=1)
    """Number of identical model replicas behind the router (with `groups`: their total)."""
    groups: list[ReplicaGroup] | None = Field(None, min_length=1)
    """Heterogeneous cluster: replica groups of different GPU types or sharding, numbered in order.
    When set, it replaces replicas, device, network_device, tensor_parallel and pipeline_stages."""
    model: str = "meta-llama/Llama-2-7b-hf"
    """Model name: one of the catalog (rollflow.perf.specs.MODELS) or any name with `model_shape` set."""
    model_shape: ModelShape | None = None
    """Shape of a model that is not in the catalog."""
    device: str = "a100"
    """GPU type of every replica: a catalog device (a100, h100, a40) or one of `devices`."""
    network_device: str = "a100_pairwise_nvlink"
    """Node type: decides GPUs per node and which network tables apply. Default for a device of
    `devices`: its own node."""
    tensor_parallel: int = Field(1, ge=1)
    """GPUs per pipeline stage, splitting every layer."""
    pipeline_stages: int = Field(1, ge=1)
    """Pipeline stages per replica, splitting the layers."""
    memory_margin_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """GPU memory kept free of weights and KV cache."""
    router: Literal[tuple(ROUTERS)] = "round_robin"  # type: ignore[valid-type]
    """Global routing policy (rollflow.policy.routing)."""
    affinity: AffinityConfig = Field(default_factory=AffinityConfig)
    """Balance thresholds of the cache-affine routers (prefix_affinity, session)."""
    router_path: str | None = None
    """learned router: the exported policy file (`rollflow router train` writes policy.npz)."""
    dispatch: Literal["on_arrival", "late_binding"] = "on_arrival"
    """When a request is bound to a replica. `on_arrival` (Vidur's global scheduler): the router
    picks as it arrives and the replica queues it. `late_binding` (rollflow's rollout manager):
    requests wait in one cluster queue, in arrival order, and the router picks among replicas
    holding fewer than `capacity` requests, as soon as one has a free slot."""
    capacity: int = Field(64, ge=1)
    """late_binding: requests a replica holds at once (queued or running), as the manager's engine capacity."""

    @model_validator(mode="after")
    def _known_model(self) -> ServingClusterConfig:
        if self.model_shape is None and self.model not in MODELS:
            raise ValueError(
                f"unknown model {self.model!r}; set cluster.model_shape or pick one of: {', '.join(MODELS)}"
            )
        if self.router == "learned" and not self.router_path:
            raise ValueError("router: learned needs cluster.router_path set to an exported policy.npz")
        if self.router != "learned" and self.router_path:
            raise ValueError("router_path is only read by router: learned")
        if self.groups is not None and self.replicas != sum(g.replicas for g in self.groups):
            raise ValueError(
                f"replicas={self.replicas} disagrees with the groups' {sum(g.replicas for g in self.groups)}; "
                "set either replicas or groups"
            )
        return self

    @field_validator("devices")
    @classmethod
    def _new_names(cls, devices: dict[str, DeviceSpec]) -> dict[str, DeviceSpec]:
        clash = [name for name in devices if name in GPUS]
        if clash:
            raise ValueError(
                f"{clash[0]!r} clashes with a catalog device ({', '.join(GPUS)}); pick another name"
            )
        return devices

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str, info: ValidationInfo) -> str:
        if "devices" in info.data:  # else the devices themselves failed, and that error says why
            _check_device(device, info.data["devices"])
        return device

    @field_validator("network_device")
    @classmethod
    def _known_node(cls, node: str, info: ValidationInfo) -> str:
        if "devices" in info.data:
            _check_node(node, info.data["devices"])
        return node

    @field_validator("groups")
    @classmethod
    def _known_group_devices(cls, groups: list[ReplicaGroup] | None, info: ValidationInfo) -> object:
        for number, group in enumerate(groups or []):
            if "devices" in info.data:
                try:
                    _check_device(group.device, info.data["devices"])
                    if group.network_device is not None:
                        _check_node(group.network_device, info.data["devices"])
                except ValueError as exc:
                    raise ValueError(f"group {number}: {exc}") from None
        return groups

    @model_validator(mode="before")
    @classmethod
    def _user_device_node(cls, data: object) -> object:
        """A device of `devices` runs in its own node unless network_device says otherwise."""
        if isinstance(data, dict) and "network_device" not in data:
            devices = data.get("devices")
            if isinstance(devices, dict) and data.get("device") in devices:
                data = {**data, "network_device": user_node_name(data["device"])}
        return data

    @model_validator(mode="before")
    @classmethod
    def _replicas_from_groups(cls, data: object) -> object:
        """With groups, `replicas` defaults to their total (so a dumped config loads back)."""
        if isinstance(data, dict) and isinstance(data.get("groups"), list) and "replicas" not in data:
            counts = [g.get("replicas", 1) if isinstance(g, dict) else 1 for g in data["groups"]]
            if all(isinstance(c, int) for c in counts):
                data = {**data, "replicas": sum(counts)}
        return data

    def replica_groups(self) -> list[ReplicaGroup]:
        """The cluster as groups: `groups`, or one group made of the homogeneous fields."""
        groups = self.groups or [
            ReplicaGroup(
                replicas=self.replicas,
                device=self.device,
                network_device=self.network_device,
                tensor_parallel=self.tensor_parallel,
                pipeline_stages=self.pipeline_stages,
            )
        ]
        return [
            g if g.network_device else g.model_copy(update={"network_device": _default_node(g.device)})
            for g in groups
        ]

    @property
    def num_replicas(self) -> int:
        return sum(g.replicas for g in self.replica_groups())

    def gpu_spec(self, device: str) -> GpuSpec:
        """The catalog's or the user's spec of `device`."""
        user = self.devices.get(device)
        return user.gpu(device) if user is not None else GPUS[device]

    def node_spec(self, network_device: str) -> NodeSpec:
        """The catalog's node, or the one a user device brings."""
        for name, spec in self.devices.items():
            if user_node_name(name) == network_device:
                return NodeSpec(network_device, name, spec.devices_per_node)
        return NODES[network_device]


def _default_node(device: str) -> str:
    return f"{device}_pairwise_nvlink"


def _check_device(device: str, devices: dict[str, DeviceSpec]) -> None:
    if device not in GPUS and device not in devices:
        known = ", ".join([*GPUS, *devices])
        raise ValueError(
            f"unknown device {device!r}; pick one of: {known}, or describe it under cluster.devices"
        )


def _check_node(node: str, devices: dict[str, DeviceSpec]) -> None:
    known = [*NODES, *(user_node_name(name) for name in devices)]
    if node not in known:
        raise ValueError(f"unknown network_device {node!r}; pick one of: {', '.join(known)}")


class SchedulerConfig(Section):
    kind: Literal["vllm", "sarathi", "orca"] = "sarathi"
    """Replica batching: vllm (whole-prompt prefill batches), sarathi (chunked prefill mixed with
    decodes), orca (iteration-level batching with KV reserved for the full request up front)."""
    batch_size_cap: int = Field(128, ge=1)
    """Most requests resident on one replica at once."""
    block_size: int = Field(16, ge=1)
    """Tokens per paged KV block."""
    watermark_blocks_fraction: float = Field(0.01, ge=0.0, lt=1.0)
    """Blocks a new request must leave free when admitted (vllm, sarathi)."""
    num_blocks: int | None = Field(None, ge=1)
    """KV blocks per replica; default: what fits in GPU memory after the weights."""
    max_tokens_in_batch: int = Field(4096, ge=1)
    """vllm: cap on batch size x longest prompt in a prefill batch."""
    chunk_size: int = Field(512, ge=1)
    """sarathi: token budget of one iteration (decodes plus prefill chunks)."""
    prefix_caching: bool = False
    """Keep computed KV blocks cached by content (vLLM's automatic prefix caching): a request's
    cached prefix skips its prefill and shares its blocks; unreferenced blocks are evicted least
    recently used first. vllm and sarathi only."""

    @model_validator(mode="after")
    def _prefix_caching_kinds(self) -> SchedulerConfig:
        if self.prefix_caching and self.kind == "orca":
            raise ValueError("prefix_caching needs kind vllm or sarathi (orca reserves whole requests)")
        return self


class ExecutionConfig(Section):
    kind: Literal["tables", "roofline"] = "roofline"
    """Where operator times come from: Vidur-format profile tables, or the roofline model."""
    compute_table: str = "./data/profiling/compute/{DEVICE}/{MODEL}/mlp.csv"
    """tables: per-layer MLP/projection times; {DEVICE}, {MODEL}, {NETWORK_DEVICE} are substituted."""
    attention_table: str = "roofline"
    """tables: attention prefill/decode times (a path), or `roofline`: from the roofline model of
    cluster.device, as Vidur's public data has no attention tables (the summary's execution_model
    says which was used)."""
    all_reduce_table: str = "./data/profiling/network/{NETWORK_DEVICE}/all_reduce.csv"
    """tables: all-reduce times (used when tensor_parallel > 1)."""
    send_recv_table: str = "./data/profiling/network/{NETWORK_DEVICE}/send_recv.csv"
    """tables: send/recv times (used when pipeline_stages > 1)."""
    kv_cache_granularity: int = Field(64, ge=1)
    """KV lengths are rounded up to a multiple of this before attention lookups."""
    attention_decode_overhead_fraction: float = Field(0.1, ge=0.0)
    """Extra decode-attention time for batched GQA models."""
    attention_prefill_overhead_fraction: float = Field(0.1, ge=0.0)
    """Extra prefill-attention time for batched GQA models."""
    nccl_cpu_launch_overhead_ms: float = Field(0.02, ge=0.0)
    """Added to every tensor-parallel all-reduce."""
    nccl_cpu_skew_overhead_per_device_ms: float = Field(0.0, ge=0.0)
    """Added per all-reduce, times tensor_parallel**1.25."""
    max_batch_size: int = Field(128, ge=1)
    """Largest decode batch the attention grid covers (larger ones are clamped)."""
    compute_efficiency: float = Field(0.6, gt=0.0, le=1.0)
    """roofline (and attention_table: roofline): achieved fraction of peak FLOP/s."""
    memory_efficiency: float = Field(0.7, gt=0.0, le=1.0)
    """roofline (and attention_table: roofline): achieved fraction of peak HBM bandwidth."""
    request_overhead_ms: float = Field(0.0, ge=0.0)
    """Time each request of the workload spends outside the engine's iterations (client to engine
    and back: HTTP, tokenizer, hand-off to the scheduler): it reaches its replica this long after it
    arrives, so TTFT and E2E include it and TPOT does not. `rollflow profile engine` prints the
    round trip it measured; 0 (Vidur's model) counts none."""
    idle_wakeup_ms: float = Field(0.0, ge=0.0)
    """Extra time of the first iteration a replica runs after it idled (nothing running): an idle
    engine's threads sleep and its clocks drop, and waking them costs the next request. An idle of
    `idle_wakeup_ramp_ms` or longer costs all of it, a shorter one that fraction of it.
    `rollflow profile engine` measures it; 0 (Vidur's model) counts none."""
    idle_wakeup_ramp_ms: float = Field(50.0, gt=0.0)
    """The idle after which waking costs the whole `idle_wakeup_ms`."""
    admission_ms: float = Field(0.0, ge=0.0)
    """Extra time of an iteration that admits a new request beside running decodes, per request
    admitted, beyond its tokens' cost: a CPU engine's server handles the new request on the cores
    the engine's step needs. `rollflow profile engine` measures it; 0 (Vidur's model) counts none."""


class TraceLengths(Section):
    kind: Literal["trace"] = "trace"
    file: str
    """CSV with num_prefill_tokens,num_decode_tokens columns; rows are shuffled by the seed."""
    prefill_scale: float = Field(1.0, gt=0.0)
    """Multiplies every prompt length drawn from the file."""
    decode_scale: float = Field(1.0, gt=0.0)
    """Multiplies every output length drawn from the file."""


class SplitTotalLengths(Section):
    """Lengths drawn as a total (prompt + output) from `min_tokens` up to the workload's `max_tokens`,
    then split into prompt and output by `prefill_to_decode_ratio`: what the uniform and Zipf
    generators share (Vidur's), which differ only in how the total is drawn. `kind` comes first
    in every dump; each generator narrows it to its own name."""

    kind: str
    min_tokens: int = Field(1024, ge=2)
    """Smallest total (prompt + output) length."""
    prefill_to_decode_ratio: float = Field(20.0, gt=0.0)
    """Prompt tokens per output token of each request."""


class UniformLengths(SplitTotalLengths):
    kind: Literal["uniform"] = "uniform"


class ZipfLengths(SplitTotalLengths):
    kind: Literal["zipf"] = "zipf"
    theta: float = Field(0.6, gt=0.0, lt=1.0)
    """Skew: larger theta puts more mass on short requests."""


class FixedLengths(Section):
    kind: Literal["fixed"] = "fixed"
    prefill_tokens: int = Field(2048, ge=1)
    """Prompt length of every request."""
    decode_tokens: int = Field(512, ge=1)
    """Output length of every request."""


LengthConfig = Annotated[
    TraceLengths | UniformLengths | ZipfLengths | FixedLengths, Field(discriminator="kind")
]


class PoissonIntervals(Section):
    kind: Literal["poisson"] = "poisson"
    qps: float = Field(1.0, gt=0.0)
    """Mean arrival rate, in requests (arrivals) per second."""
    max_gap_factor: float | None = Field(None, gt=0.0)
    """Clip every gap at this multiple of the mean gap 1/qps. Unset: exact Poisson. Vidur's
    generator clips at 3, which drops the long gaps: its requests arrive about 5% faster than
    `qps` (mean gap (1 - e^-3)/qps)."""


class GammaIntervals(Section):
    kind: Literal["gamma"] = "gamma"
    qps: float = Field(1.0, gt=0.0)
    """Mean arrival rate, in requests (arrivals) per second."""
    cv: float = Field(0.5, gt=0.0)
    """Coefficient of variation of the gaps: above 1 is burstier than Poisson."""


class StaticIntervals(Section):
    kind: Literal["static"] = "static"
    """Every request arrives at time 0."""


IntervalConfig = Annotated[PoissonIntervals | GammaIntervals | StaticIntervals, Field(discriminator="kind")]


class TraceWorkload(Section):
    kind: Literal["trace"] = "trace"
    file: str
    """CSV in Vidur's format: arrived_at,num_prefill_tokens,num_decode_tokens."""
    time_scale: float = Field(1.0, gt=0.0)
    """Multiplies arrival times (below 1 raises the load)."""
    prefill_scale: float = Field(1.0, gt=0.0)
    """Multiplies every prompt length of the trace."""
    decode_scale: float = Field(1.0, gt=0.0)
    """Multiplies every output length of the trace."""
    max_tokens: int = Field(4096, ge=2)
    """Prompt + output cap; longer requests lose prompt tokens (as Vidur does)."""
    num_requests: int | None = Field(None, ge=1)
    """Replay only the first N rows."""


class GroupsConfig(Section):
    """GRPO-shaped traffic: every arrival is one prompt submitted `size` times at once."""

    size: int = Field(8, ge=1)
    """Samples per prompt (n); they share the prompt and differ in their outputs."""


class SessionsConfig(Section):
    """Multi-turn agents: every arrival opens a session of `turns` turns; turn k's prompt is turn
    k-1's prompt, its answer and `turn_tokens` new tokens (a tool result, the next user message).

    Open loop: turn k arrives `think_time_s` after turn k-1 arrived, whether or not it finished.
    A session ends early when its next turn would exceed `workload.max_tokens`."""

    turns: int = Field(4, ge=1)
    """Turns per session."""
    think_time_s: float = Field(5.0, ge=0.0)
    """Time between the arrivals of consecutive turns."""
    turn_tokens: int = Field(128, ge=1)
    """New prompt tokens each turn after the first adds."""


class SyntheticWorkload(Section):
    kind: Literal["synthetic"] = "synthetic"
    num_requests: int | None = Field(128, ge=1)
    """Arrivals to generate (a group or a session counts once)."""
    duration_s: float | None = Field(None, gt=0.0)
    """If set, generate arrivals until this time instead of num_requests."""
    max_tokens: int = Field(4096, ge=2)
    """Prompt + output cap of a request."""
    lengths: LengthConfig = Field(default_factory=FixedLengths)
    """How prompt and output lengths are drawn (chosen by `kind`; default fixed)."""
    intervals: IntervalConfig = Field(default_factory=PoissonIntervals)
    """How the gaps between arrivals are drawn (chosen by `kind`; default poisson)."""
    rng: Literal["numpy", "vidur"] = "numpy"
    """numpy: gaps, then lengths, from one numpy Generator(seed). vidur: the requests Vidur's
    synthetic generator draws for the same seed (gaps from Python's random.Random(seed), the
    trace shuffled by numpy's legacy RandomState(seed)), so both simulators see the same list;
    trace or fixed lengths with poisson or static intervals and num_requests only."""
    system_prompt_tokens: int = Field(0, ge=0)
    """A system prompt every request starts with (part of its prompt length)."""
    groups: GroupsConfig | None = None
    """Submit each prompt n times (GRPO); unset: one request per arrival."""
    sessions: SessionsConfig | None = None
    """Multi-turn sessions; unset: single-turn requests."""

    @model_validator(mode="before")
    @classmethod
    def _default_kinds(cls, data: object) -> object:
        return fill_default_kinds(data, {"lengths": "fixed", "intervals": "poisson"})

    @model_validator(mode="after")
    def _prefix_shapes(self) -> SyntheticWorkload:
        if self.groups is not None and self.sessions is not None:
            raise ValueError("set workload.groups or workload.sessions, not both")
        if self.system_prompt_tokens + 2 > self.max_tokens:
            raise ValueError("system_prompt_tokens must leave room for a prompt token and an output token")
        if self.rng == "vidur":
            _check_vidur_draws(self)
        return self


def _check_vidur_draws(workload: SyntheticWorkload) -> None:
    """`rng: vidur` reproduces only what Vidur's synthetic generator draws in the shapes it has."""
    if workload.lengths.kind not in ("trace", "fixed"):
        raise ValueError(f"rng=vidur takes lengths.kind trace or fixed, not {workload.lengths.kind}")
    if workload.intervals.kind not in ("poisson", "static"):
        raise ValueError(f"rng=vidur takes intervals.kind poisson or static, not {workload.intervals.kind}")
    if workload.duration_s is not None or workload.num_requests is None:
        raise ValueError("rng=vidur takes num_requests, not duration_s")
    if workload.system_prompt_tokens or workload.groups is not None or workload.sessions is not None:
        raise ValueError("rng=vidur takes no system_prompt_tokens, groups or sessions (Vidur has none)")


class RolloutBurstWorkload(Section):
    """One RL rollout: B prompts x G samples submitted together, long-tailed output lengths."""

    kind: Literal["rl_burst"] = "rl_burst"
    num_prompts: int = Field(64, ge=1)
    """Prompts of the rollout (B)."""
    samples_per_prompt: int = Field(8, ge=1)
    """Samples per prompt (G), submitted together with their prompt."""
    prompt_tokens: int = Field(512, ge=1)
    """Mean prompt length (prompts vary uniformly by +-prompt_jitter)."""
    prompt_jitter: float = Field(0.25, ge=0.0, lt=1.0)
    """Relative spread of prompt lengths around `prompt_tokens` (uniform, +- this fraction)."""
    output: Literal["lognormal", "trace"] = "lognormal"
    """Output length source: a lognormal long tail, or the decode column of `output_trace`."""
    output_median_tokens: int = Field(1024, ge=1)
    """Median output length of the lognormal tail."""
    output_sigma: float = Field(1.0, ge=0.0)
    """Lognormal sigma: 1.0 gives a p99/median ratio of about 10."""
    output_trace: str | None = None
    """CSV with a num_decode_tokens column, read when `output: trace`."""
    max_new_tokens: int = Field(8192, ge=1)
    """Outputs are clipped here, as a rollout's max_new_tokens would."""
    arrival_s: float = Field(0.0, ge=0.0)
    """When the burst is submitted, in simulated seconds."""

    @model_validator(mode="after")
    def _trace_needs_file(self) -> RolloutBurstWorkload:
        if self.output == "trace" and not self.output_trace:
            raise ValueError("output: trace needs output_trace set to a CSV with num_decode_tokens")
        return self


WorkloadConfig = Annotated[
    TraceWorkload | SyntheticWorkload | RolloutBurstWorkload, Field(discriminator="kind")
]


class OutputConfig(Section):
    dir: str = "outputs/sim"
    """Folder for summary.json, requests.csv, chrome_trace.json and plots/."""
    plots: bool = True
    """Draw plots/: the latency CDFs and each replica's timeline."""
    chrome_trace: bool = True
    """Write chrome_trace.json (open it in Perfetto or chrome://tracing)."""
    requests_csv: bool = True
    """Write requests.csv, one line per request with its times."""
    progress: bool = True
    """Show a progress bar on long runs (off when not a terminal)."""
    percentiles: list[float] = Field([50.0, 90.0, 99.0], min_length=1)
    """Percentiles of every latency metric in summary.json and the printed table (keys p50,
    p95, p99.9), by numpy's linear interpolation between order statistics."""

    @field_validator("percentiles")
    @classmethod
    def _open_interval(cls, percentiles: list[float]) -> list[float]:
        bad = [p for p in percentiles if not 0.0 < p < 100.0]
        if bad:
            raise ValueError(f"every percentile must be in (0, 100), got {bad[0]:g}")
        return sorted(set(percentiles))


class SimulatorConfig(Section):
    fast_forward: bool = True
    """Advance an unchanged decode batch many iterations per event (exact; off = one event per iteration)."""
    time_limit_s: float | None = Field(None, gt=0.0)
    """Stop simulating at this simulated time."""


class SimConfig(Section):
    seed: int = 42
    """Seed of every random draw (workload, sampling of lengths and gaps): the same seed gives the same run."""
    cluster: ServingClusterConfig = Field(default_factory=ServingClusterConfig)
    """The replicas, their GPUs and sharding, and the router in front of them."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """Each replica's batch scheduler and KV cache."""
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    """Where execution times come from (profile tables or the roofline model)."""
    workload: WorkloadConfig = Field(default_factory=SyntheticWorkload)
    """The requests: a trace, a synthetic workload or an RL rollout burst (chosen by `kind`)."""
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig)
    """How the event loop runs."""
    output: OutputConfig = Field(default_factory=OutputConfig)
    """What the run writes, and where."""

    @model_validator(mode="before")
    @classmethod
    def _default_kinds(cls, data: object) -> object:
        return fill_default_kinds(data, {"workload": "synthetic"})

    @property
    def max_tokens(self) -> int:
        """Longest request (prompt + output) the workload can produce; sizes KV slots and grids."""
        workload = self.workload
        if isinstance(workload, RolloutBurstWorkload):
            return int(workload.prompt_tokens * (1 + workload.prompt_jitter)) + 1 + workload.max_new_tokens
        return workload.max_tokens
