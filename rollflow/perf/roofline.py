"""Roofline execution-time model: any model on any GPU, from shapes and peak numbers alone.

Each operator takes the longer of its compute time and its memory time, plus a fixed kernel
launch cost. Per layer, on one GPU of a replica with tensor parallelism `tp`
(P = weights of one layer on that GPU, h = embedding dim, d = head dim,
q = query heads per GPU, k = KV heads per GPU, n = tokens in the batch):

    linear(n)     = max(2 * n * P / (F * e_c),  2 * (P + 4 * n * h) / (B * e_m)) + 6 * t_launch
                    + 2 * allreduce(2 * n * h bytes)                      (when tp > 1)
    allreduce(x)  = 2 * (tp - 1) / tp * x / L + t_link
    decode(b, s)  = b * s * 2 * k * d * 2 / (B * e_m) + t_launch          (b sequences, s cached tokens)
    prefill(p, c) = 4 * c * (p + c / 2) * q * d / (F * e_c) + t_launch    (chunk c over prefix p)
    send_recv(n)  = 2 * n * h / L' + t_link                               (once per pipeline stage)

F is the GPU's fp16 peak FLOP/s, B its HBM bandwidth, L its per-GPU link bandwidth (L' the
inter-node bandwidth when a pipeline hop leaves the node); e_c and e_m are achievable
fractions of peak (defaults 0.6 and 0.7, as the attention table tool assumes).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

import numpy as np

from rollflow.perf.optimes import OperatorTimes, PrefillGrid
from rollflow.perf.specs import GpuSpec, ModelSpec, NodeSpec, ParallelLayout


@dataclass(frozen=True)
class RooflineEfficiency:
    compute: float = 0.6
    memory: float = 0.7
    kernel_launch_ms: float = 0.005
    link_latency_ms: float = 0.01
    inter_node_gb_per_s: float = 25.0


def roofline_operator_times(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: ParallelLayout,
    node: NodeSpec,
    max_tokens: int,
    max_batch_size: int,
    kv_granularity: int = 64,
    efficiency: RooflineEfficiency = RooflineEfficiency(),
) -> OperatorTimes:
    tp = layout.tensor_parallel
    flops = gpu.fp16_tflops * 1e12 * efficiency.compute
    hbm = gpu.hbm_gb_per_s * 1e9 * efficiency.memory
    link = gpu.link_gb_per_s * 1e9
    launch = efficiency.kernel_launch_ms
    h, d = model.embedding_dim, model.head_dim
    q_local, kv_local = model.num_q_heads // tp, ceil(model.num_kv_heads / tp)
    mlp_mats = 3 if model.use_gated_mlp else 2
    layer_params = h * d * (2 * q_local + 2 * kv_local) + mlp_mats * h * model.mlp_hidden_dim // tp

    size = max_tokens + 9
    n = np.arange(size, dtype=float)
    compute_ms = 2 * n * layer_params / flops * 1e3
    memory_ms = 2 * (layer_params + 4 * n * h) / hbm * 1e3
    linear = np.maximum(compute_ms, memory_ms) + 6 * launch
    if tp > 1:
        allreduce = 2 * (tp - 1) / tp * (2 * n * h) / link * 1e3 + efficiency.link_latency_ms
        linear = linear + 2 * allreduce

    num_buckets = (size - 1) // kv_granularity + 2
    kv_axis = np.arange(num_buckets, dtype=float) * kv_granularity
    batch_axis = np.arange(max_batch_size + 1, dtype=float)[:, None]
    decode = batch_axis * kv_axis[None, :] * 2 * kv_local * d * 2 / hbm * 1e3 + launch

    chunks = np.array([16, 32, *range(64, max_tokens + 1, 64)], dtype=float)
    kv_points = tuple(np.array([0.0, float(max_tokens * max_batch_size)]) for _ in chunks)
    prefill_times = tuple(
        4 * c * (kv + c / 2) * q_local * d / flops * 1e3 + launch
        for c, kv in zip(chunks, kv_points, strict=True)
    )

    if layout.pipeline_stages > 1:
        crosses_nodes = layout.world_size > node.num_devices_per_node
        hop_bw = efficiency.inter_node_gb_per_s * 1e9 if crosses_nodes else link
        send_recv = 2 * n * h / hop_bw * 1e3 + efficiency.link_latency_ms
    else:
        send_recv = np.zeros(size)
    return OperatorTimes(
        linear_ms=linear,
        kv_save_ms=np.zeros(size),
        send_recv_ms=send_recv,
        decode_ms=decode,
        prefill=PrefillGrid(chunks, kv_points, prefill_times),
        kv_granularity=kv_granularity,
        source=f"roofline: {model.name} on {gpu.name}",
    )
