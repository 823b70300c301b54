"""`rollflow train` config: where the manager and model are, the algorithm, and the step's shape."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rollflow.config import StrictModel
from rollflow.policy.oversample import PartialRollout
from rollflow.policy.placement import ClusterConfig

DEFAULT_MANAGER_URL = "http://127.0.0.1:30100"


class TrainConfig(StrictModel):
    manager_url: str = Field(
        default_factory=lambda: os.environ.get("ROLLFLOW_MANAGER_URL", DEFAULT_MANAGER_URL)
    )
    """The rollout manager the engines are registered with; default $ROLLFLOW_MANAGER_URL (which
    `rollflow launch up` sets for its trainer command), else http://127.0.0.1:30100."""
    manager_token: str | None = None
    """Bearer token for the manager's admin routes (weight updates); default $ROLLFLOW_MANAGER_TOKEN."""
    manager_reconnect_s: float = Field(120.0, ge=0)
    """How long the trainer waits for a manager that went away (restarting from its journal) before it
    stops with an error; it then carries on with the same batch. 0: stop at once."""
    model: str
    """Checkpoint folder of the initial policy (also the frozen reference model); engines start on it."""
    algorithm: Literal["grpo", "ppo"] = "grpo"
    """grpo: group-relative advantages, no critic; ppo: a critic with a value head and GAE."""
    lr: float = Field(1e-4, gt=0)
    """Adam learning rate of the policy (and of the critic for ppo)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients (policy and critic together) are scaled down to this norm before each optimizer step."""
    clip: float = Field(0.2, gt=0)
    """PPO clip range of the importance ratio: [1 - clip, 1 + clip]."""
    kl_coef: float = Field(0.02, ge=0)
    """Weight of the KL penalty to the reference model (k3 estimator, per token)."""
    gamma: float = Field(1.0, gt=0, le=1)
    """ppo: discount per token."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """ppo: GAE lambda."""
    value_coef: float = Field(0.5, ge=0)
    """ppo: weight of the critic's squared error."""
    n_samples: int = Field(8, ge=1)
    """Samples per prompt (a group); grpo needs at least 2 for a non-zero advantage."""
    prompts_per_step: int = Field(8, ge=1)
    """Prompts in each step's batch."""
    micro_batch_groups: int = Field(2, ge=1)
    """Groups per forward/backward: the trainer takes exactly this many finished groups from the manager
    (the step's last micro-batch may hold fewer), so the number of optimizer steps does not depend on timing."""
    mini_batch_micro_batches: int = Field(2, ge=1)
    """Micro-batches whose gradients accumulate into one optimizer step."""
    steps: int = Field(10, ge=1)
    """Training steps (one batch of rollouts and one weight push each) to reach in total."""
    max_new_tokens: int = Field(16, ge=1)
    """Most tokens generated per sample."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of the engines; the trainer's log-probs use the same one."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end a sample besides end-of-sequence (SGLang's `stop`): a task's answer delimiter.
    On the tiny model a common letter makes lengths geometric, with a long tail
    (examples/train/partial_tail.yaml)."""
    off_policy: bool = False
    """Submit the next step's batch before training on this one; its samples may span weight versions."""
    max_staleness: int = Field(1, ge=0)
    """Off-policy or partial rollout: reject a sample any of whose tokens came from more than this many
    versions back (partial rollout restarts a carried sample from its prompt before that happens)."""
    partial_rollout: PartialRollout = 0
    """Partial rollout: groups of extra prompts each step runs beside its `prompts_per_step`; the step
    trains the first `prompts_per_step` groups to finish, aborts the rest with the tokens they have and
    carries them into the next step, resumed first (rollflow/runtime/trainer/partial.py). 0: off.
    `auto`: each step's number is chosen from the recent groups' response lengths, more for a heavier
    tail, 0 for uniform lengths (`rollflow.policy.oversample`, as `rollflow rl-sim` chooses it)."""
    reward: str = "rollflow.runtime.trainer.tasks:letter_e"
    """'module:function' (prompt_ids, output_ids, tokenizer) -> float; see rollflow/runtime/trainer/tasks.py."""
    prompts: str = "rollflow.runtime.trainer.tasks:random_prompts"
    """'module:function' (tokenizer, num, rng) -> list of prompt token-id lists."""
    environment: str | None = None
    """'module:function' (prompt_ids, turns, tokenizer) -> the environment's token ids after the model's
    last turn, or None to end the episode. Set, every sample is a multi-turn episode on a manager
    session (rollflow/runtime/trainer/episodes.py): the environment's tokens are masked out of the
    loss and the reward sees the model's own tokens. Example: rollflow.runtime.trainer.tasks:calculator."""
    max_turns: int = Field(4, ge=1)
    """With `environment`: turns an episode takes at most."""
    output_dir: str = "outputs/train"
    """metrics.csv, tensorboard/, weights/v{N}/ pushed to engines, checkpoints/step_{N}/."""
    checkpoint_every: int = Field(1, ge=1)
    """Save model, optimizer and step every this many steps (and after the last step)."""
    keep_weight_versions: int = Field(2, ge=1)
    """Pushed weight folders to keep on disk (engines load from them)."""
    weights_url: str | None = Field(default_factory=lambda: os.environ.get("ROLLFLOW_WEIGHTS_URL") or None)
    """Weight server (`rollflow weights serve`): each version is published there (token from
    $ROLLFLOW_WEIGHTS_TOKEN) and engines pull it, instead of loading weights/vN from a shared disk
    (engines that cannot pull, vLLM and SGLang, still load from it). Default $ROLLFLOW_WEIGHTS_URL,
    which `rollflow launch up` sets when it starts a weight server."""
    weights_codec: str = "delta+zstd"
    """Codec engines pull with (weights_url only): delta+zstd sends only what changed since their version."""
    weights_transport: Literal["http", "mooncake"] = "http"
    """How engines pull each version's chunks from the weight server (weights_url only): http GETs, or
    mooncake: read straight from the server's registered memory by Mooncake's transfer engine (the
    server started with `--mooncake tcp` or `rdma`). An engine that cannot use Mooncake pulls over http
    and logs why. With `parallelism: fsdp` under torchrun, each rank instead registers its own shard
    and engines read it from the ranks (rollflow/runtime/trainer/shard_export.py): no rank gathers the
    model and the weight server holds only the manifest."""
    mooncake_protocol: Literal["tcp", "rdma"] = "tcp"
    """fsdp with mooncake: how engines read the ranks' shards (rdma needs an RDMA NIC on both sides)."""
    mooncake_host: str = "127.0.0.1"
    """fsdp with mooncake: the address each rank's TransferEngine listens on, where engines reach it
    (this node's address when engines run on other machines)."""
    seed: int = 0
    """Seed of torch (a new critic's initialisation) and of the trainer's own random draws."""
    device: str = "cpu"
    """torch device of the trainer's models: cpu, cuda, cuda:1, ... (under torchrun: cpu, or cuda for
    cuda:LOCAL_RANK on each rank)."""
    cluster: ClusterConfig | None = None
    """Where the components sit (RLinf's `cluster:` section, README section Placement): the actor trains as an
    elastic actor, one process per device of its range (cpu: device slots of `threads_per_device` threads;
    cuda: GPU i), rank 0 being this process. Leave out to train in this one process (or under torchrun)."""
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun, how the ranks split the work: ddp: every rank holds the whole model, optimizer
    state and gradients (fastest while they fit one device); fsdp: FSDP2, each rank holds 1/ranks of
    them and gathers a block's weights only while it runs (for models whose training state does not
    fit one device). Both train to the same weights; fsdp checkpoints are sharded. Without torchrun
    there is one rank and no difference."""
    distributed_timeout_s: float = Field(1800.0, gt=0)
    """Under torchrun: how long a rank waits on the others (rank 0 meanwhile waits for rollouts and pushes
    weights) before it fails the job instead of hanging."""

    @model_validator(mode="after")
    def _device_exists(self) -> TrainConfig:
        import torch

        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"device: not a torch device: {self.device!r} (try cpu or cuda)") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {self.device!r} asked for, but torch sees no CUDA GPU")
        return self

    @field_validator("weights_codec")
    @classmethod
    def _known_codec(cls, value: str) -> str:
        from rollflow.runtime.weights.codecs import CodecSpec

        return CodecSpec.parse(value).name

    @property
    def minibatch_samples(self) -> int:
        """Samples in one mini-batch (one optimizer step): what the actor's data-parallel size must divide."""
        return self.micro_batch_groups * self.mini_batch_micro_batches * self.n_samples

    @property
    def minibatches_per_step(self) -> int:
        """Optimizer steps in one training step (the last mini-batch may be partial)."""
        micro_batches = -(-self.prompts_per_step // self.micro_batch_groups)
        return -(-micro_batches // self.mini_batch_micro_batches)

    @model_validator(mode="after")
    def _placement_fits(self) -> TrainConfig:
        if self.cluster is None:
            return self
        problem = self.cluster.actor_size_problem(self.minibatch_samples)
        if problem is not None:
            raise ValueError(f"{problem} (micro_batch_groups x mini_batch_micro_batches x n_samples)")
        import torch

        if torch.device(self.device).type != self.cluster.device:
            first = "cpu" if self.cluster.device == "cpu" else "cuda:0"
            raise ValueError(
                f"device: {self.device!r}, but cluster.device={self.cluster.device} (rank 0 sits on {first}); "
                f"set device: {first}"
            )
        return self

    @model_validator(mode="after")
    def _partial_rollout_fits(self) -> TrainConfig:
        if not self.partial_rollout:
            return self
        if self.environment is not None:
            raise ValueError(
                "partial_rollout: multi-turn episodes (environment) are not carried across steps; "
                "set partial_rollout: 0 or leave environment unset"
            )
        if (
            self.cluster is not None
            and "inference" in self.cluster.component_placement
            and self.algorithm == "ppo"
        ):
            raise ValueError(
                "partial_rollout: with ppo, inference workers recompute old log-probs on one version, but "
                "carried samples span versions; set partial_rollout: 0 or leave inference out of the placement"
            )
        return self

    @model_validator(mode="after")
    def _elastic_actor_is_ddp(self) -> TrainConfig:
        if self.cluster is not None and self.parallelism == "fsdp":
            raise ValueError(
                "parallelism: fsdp runs under torchrun, but `cluster:` starts an elastic actor whose ranks "
                "each hold the whole model; drop one of the two"
            )
        return self

    @model_validator(mode="after")
    def _grpo_needs_groups(self) -> TrainConfig:
        if self.algorithm == "grpo" and self.n_samples < 2:
            raise ValueError("n_samples: grpo needs at least 2 samples per prompt (got 1)")
        return self
