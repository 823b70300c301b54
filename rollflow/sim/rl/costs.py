"""Times of the non-rollout work of a step, from FLOPs and bytes over the `perf` specs.

Rollout time comes from the serving simulator (replica batching timed by the execution-time
predictor). Training and inference run as large dense passes, so their time is FLOPs over the
GPUs' peak at a configured MFU: training 6 x params x tokens (8 with activation recompute),
each inference forward pass 2 x params x tokens. Weight transfers are bytes over a link.
Attention FLOPs and embeddings are left out (a few % for 8B models at these lengths).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollflow.perf.specs import GPUS, MODELS, ModelSpec, ParallelLayout, params_per_device
from rollflow.sim.rl.config import RLSimConfig


@dataclass(frozen=True)
class StepCosts:
    num_params: int
    peak_flops_per_gpu: float
    nvlink_gb_per_s: float
    train_mfu: float
    train_flops_per_token_param: float
    optimizer_step_s: float
    inference_mfu: float
    inference_passes: int
    reshard_bytes_per_param: float
    reshard_gb_per_s: float
    sync_bytes_per_param: float
    sync_link_gb_per_s: float
    sync_fixed_s: float
    spot_link_gb_per_s: float

    @classmethod
    def from_config(cls, config: RLSimConfig) -> StepCosts:
        if config.model_shape is not None:
            model = ModelSpec(name=config.model, **config.model_shape.model_dump())
        else:
            model = MODELS[config.model]
        gpu = GPUS[config.device]
        training = config.training
        return cls(
            num_params=params_per_device(model, ParallelLayout()),
            peak_flops_per_gpu=gpu.fp16_tflops * 1e12,
            nvlink_gb_per_s=gpu.link_gb_per_s,
            train_mfu=training.mfu,
            train_flops_per_token_param=8.0 if training.recompute else 6.0,
            optimizer_step_s=training.optimizer_step_s,
            inference_mfu=config.inference.mfu,
            inference_passes=config.inference.num_models,
            reshard_bytes_per_param=training.reshard_bytes_per_param,
            reshard_gb_per_s=training.reshard_gb_per_s,
            sync_bytes_per_param=config.weight_sync.bytes_per_param,
            sync_link_gb_per_s=config.weight_sync.link_gb_per_s,
            sync_fixed_s=config.weight_sync.fixed_s,
            spot_link_gb_per_s=config.spot.link_gb_per_s,
        )

    def train_s(self, tokens: int, num_gpus: int) -> float:
        """One mini-batch: forward + backward over `tokens`, then the optimizer step."""
        flops = self.train_flops_per_token_param * self.num_params * tokens
        return flops / (num_gpus * self.peak_flops_per_gpu * self.train_mfu) + self.optimizer_step_s

    def inference_s(self, tokens: int, num_gpus: int) -> float:
        flops = 2.0 * self.inference_passes * self.num_params * tokens
        return flops / (num_gpus * self.peak_flops_per_gpu * self.inference_mfu)

    def reshard_s(self, new_num_gpus: int) -> float:
        """A growing actor: every GPU of the new layout receives its shard of the model states."""
        per_gpu = self.reshard_bytes_per_param * self.num_params / new_num_gpus
        return per_gpu / (self.reshard_gb_per_s * 1e9)

    def sync_s(self, collocated: bool, to_spot: bool) -> float:
        """Weights to rollout: over NVLink when collocated, else over the configured link(s)."""
        size = self.sync_bytes_per_param * self.num_params
        link = self.nvlink_gb_per_s if collocated else self.sync_link_gb_per_s
        seconds = size / (link * 1e9)
        if to_spot:
            seconds = max(seconds, size / (self.spot_link_gb_per_s * 1e9))
        return seconds + self.sync_fixed_s
