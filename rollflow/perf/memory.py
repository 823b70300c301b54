"""KV-cache capacity of a replica: how many paged blocks fit beside the weights."""

from __future__ import annotations

from rollflow.perf.specs import GpuSpec, ModelSpec, ParallelLayout, kv_bytes_per_token, params_per_device


def max_resident_requests(
    model: ModelSpec, layout: ParallelLayout, gpu: GpuSpec, memory_margin_fraction: float, max_tokens: int
) -> int:
    """Requests of `max_tokens` whose fp16 KV cache fits on one GPU after the fp16 weights.

    Vidur counts every layer's KV on each GPU; a pipeline stage holds only its own layers, so
    rollflow counts those (identical without pipeline parallelism).
    """
    available = gpu.memory_gb * 1024**3 * (1 - memory_margin_fraction) - 2 * params_per_device(model, layout)
    per_request = kv_bytes_per_token(model, layout) * max_tokens
    count = int(available // per_request)
    if count <= 0:
        raise ValueError(
            f"{model.name} with tensor_parallel={layout.tensor_parallel}, pipeline_stages="
            f"{layout.pipeline_stages} leaves no room on a {gpu.name} for one {max_tokens}-token request"
        )
    return count


def default_num_blocks(
    model: ModelSpec,
    layout: ParallelLayout,
    gpu: GpuSpec,
    memory_margin_fraction: float,
    max_tokens: int,
    block_size: int,
) -> int:
    """Blocks per replica: one full-length request per resident slot, per pipeline stage (as Vidur)."""
    slots = (
        max_resident_requests(model, layout, gpu, memory_margin_fraction, max_tokens) * layout.pipeline_stages
    )
    return (max_tokens // block_size) * slots
