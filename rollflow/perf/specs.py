"""Model, GPU and node specifications: the shapes every execution-time model starts from.

The catalog carries the models and devices for which Vidur publishes profiling tables, under
the same names (so a table path like `compute/{DEVICE}/{MODEL}/mlp.csv` resolves), plus peak
numbers for the roofline model. Users add their own through the config (`cluster.model_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil


@dataclass(frozen=True)
class ModelSpec:
    """Transformer shape; enough to count parameters, FLOPs and KV-cache bytes."""

    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    embedding_dim: int
    mlp_hidden_dim: int
    vocab_size: int
    use_gated_mlp: bool = True
    # Llama-style blocks have a second norm before the MLP; phi-2 does not.
    post_attn_norm: bool = True

    @property
    def head_dim(self) -> int:
        return self.embedding_dim // self.num_q_heads

    @property
    def is_gqa(self) -> bool:
        return self.num_q_heads > self.num_kv_heads


@dataclass(frozen=True)
class GpuSpec:
    """Peak numbers of one accelerator; the roofline model divides work by these."""

    name: str
    fp16_tflops: float
    memory_gb: float
    hbm_gb_per_s: float
    # Per-GPU bandwidth of the fastest link to a peer (NVLink), for collectives.
    link_gb_per_s: float


@dataclass(frozen=True)
class NodeSpec:
    """How GPUs are grouped; decides whether a pipeline hop crosses machines."""

    name: str
    device: str
    num_devices_per_node: int


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("meta-llama/Llama-2-7b-hf", 32, 32, 32, 4096, 11008, 32768),
        ModelSpec("meta-llama/Llama-2-70b-hf", 80, 64, 8, 8192, 28672, 32768),
        ModelSpec("meta-llama/Meta-Llama-3-8B", 32, 32, 8, 4096, 14336, 128256),
        ModelSpec("meta-llama/Meta-Llama-3-70B", 80, 64, 8, 8192, 28672, 128256),
        ModelSpec("codellama/CodeLlama-34b-Instruct-hf", 48, 64, 8, 8192, 22016, 32768),
        ModelSpec("internlm/internlm-20b", 60, 40, 40, 5120, 13824, 103168),
        ModelSpec("Qwen/Qwen-72B", 80, 64, 64, 8192, 24576, 152064),
        ModelSpec(
            "microsoft/phi-2", 32, 32, 32, 2560, 10240, 51200, use_gated_mlp=False, post_attn_norm=False
        ),
    )
}

GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("a100", fp16_tflops=312, memory_gb=80, hbm_gb_per_s=2039, link_gb_per_s=300),
        GpuSpec("h100", fp16_tflops=989, memory_gb=80, hbm_gb_per_s=3350, link_gb_per_s=450),
        GpuSpec("a40", fp16_tflops=149.7, memory_gb=45, hbm_gb_per_s=696, link_gb_per_s=56),
    )
}

NODES: dict[str, NodeSpec] = {
    spec.name: spec
    for spec in (
        NodeSpec("a100_pairwise_nvlink", "a100", 4),
        NodeSpec("h100_pairwise_nvlink", "h100", 4),
        NodeSpec("a40_pairwise_nvlink", "a40", 8),
        NodeSpec("a100_dgx", "a100", 8),
        NodeSpec("h100_dgx", "h100", 8),
    )
}


@dataclass(frozen=True)
class ParallelLayout:
    """How one replica shards a model: tensor parallel inside a stage, pipeline stages across."""

    tensor_parallel: int = 1
    pipeline_stages: int = 1

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_stages


def params_per_device(model: ModelSpec, layout: ParallelLayout) -> int:
    """Weights one GPU holds (attention + MLP of its layers; embeddings left out, as Vidur does)."""
    tp = layout.tensor_parallel
    q_local = model.num_q_heads // tp
    kv_local = ceil(model.num_kv_heads / tp)
    attention = model.embedding_dim * model.head_dim * (2 * q_local + 2 * kv_local)
    mlp_mats = 3 if model.use_gated_mlp else 2
    mlp = mlp_mats * model.embedding_dim * model.mlp_hidden_dim // tp
    return (attention + mlp) * (model.num_layers // layout.pipeline_stages)


def kv_bytes_per_token(model: ModelSpec, layout: ParallelLayout) -> int:
    """fp16 K and V of one token on one GPU, over the layers of its pipeline stage."""
    kv_local = ceil(model.num_kv_heads / layout.tensor_parallel)
    layers = model.num_layers // layout.pipeline_stages
    return 2 * 2 * model.head_dim * kv_local * layers


def validate_layout(model: ModelSpec, layout: ParallelLayout) -> None:
    """Reject shardings that do not divide the model evenly, naming the mismatch."""
    if model.num_layers % layout.pipeline_stages:
        raise ValueError(
            f"{model.name} has {model.num_layers} layers, not divisible by "
            f"pipeline_stages={layout.pipeline_stages}"
        )
    if model.num_q_heads % layout.tensor_parallel or model.embedding_dim % layout.tensor_parallel:
        raise ValueError(
            f"{model.name} has {model.num_q_heads} heads / embedding {model.embedding_dim}, not divisible "
            f"by tensor_parallel={layout.tensor_parallel}"
        )
