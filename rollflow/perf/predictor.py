"""Batch composition -> execution time of one pipeline stage, from operator time grids.

The composition rules follow Vidur so that both simulators agree on the same tables: token
counts are rounded up to a multiple of 8 for the linear operators; decode attention is looked
up at the decode batch size and the mean KV length rounded up to the KV granularity; the
prefills of a batch are folded into one lookup at the summed (rounded) cached prefixes and the
root of the summed squared chunk sizes; GQA models pay a batching overhead on attention.
"""

from __future__ import annotations

import logging
from math import sqrt

from rollflow.native import pure_python
from rollflow.perf.optimes import OperatorTimes
from rollflow.perf.specs import ModelSpec, ParallelLayout, params_per_device

logger = logging.getLogger(__name__)

_COMPILED_METHODS = ("stage_seconds", "decode_run", "chunk_run")
_noted_missing = False


class ExecutionTimePredictor:
    """Seconds per stage iteration for one replica shape. Lookups only; no model evaluation.

    The methods below are the reference. Where the C extension `rollflow.perf._timing` is built
    (`make compiled`, or any `pip install` of rollflow with a C compiler), each predictor replaces
    `stage_seconds`, `decode_run` and `chunk_run` with its compiled twins, which compute the
    same operations in the same order (tests check both give identical times); `compiled` says
    which ones run. ROLLFLOW_PURE_PYTHON=1 keeps the Python ones.
    """

    def __init__(
        self,
        times: OperatorTimes,
        model: ModelSpec,
        layout: ParallelLayout,
        attention_decode_overhead_fraction: float = 0.1,
        attention_prefill_overhead_fraction: float = 0.1,
        max_batch_size: int = 0,
    ) -> None:
        self.times = times
        self.num_layers = model.num_layers // layout.pipeline_stages
        self.num_stages = layout.pipeline_stages
        self._linear = times.linear_ms.tolist()
        self._kv_save = times.kv_save_ms.tolist()
        self._send_recv = times.send_recv_ms.tolist()
        # Rows up to the largest batch the replica can form (the grid's last row repeats beyond its
        # range, as a tree model would), so a lookup never needs a bounds check.
        self._decode = times.decode_ms.tolist()
        self._decode += [self._decode[-1]] * max(0, max_batch_size + 1 - len(self._decode))
        self._last_token = len(self._linear) - 1
        self._granularity = times.kv_granularity
        # The batching overheads apply to grouped-query attention only (Vidur's measurement).
        self._decode_overhead = attention_decode_overhead_fraction if model.is_gqa else 0.0
        self._prefill_overhead = attention_prefill_overhead_fraction if model.is_gqa else 0.0
        # FLOPs per token through the weights, and per (query, key) pair in attention, for MFU.
        self.flops_per_token = 2 * params_per_device(model, layout)
        self.attention_flops_per_pair = (
            4 * self.num_layers * (model.num_q_heads // layout.tensor_parallel) * model.head_dim
        )
        self.compiled = self._use_compiled()

    def _use_compiled(self) -> bool:
        """Bind the compiled lookups to this instance, if built and allowed; True if they are."""
        global _noted_missing
        if pure_python():
            return False
        try:
            from rollflow.perf._timing import StageTimer
        except ImportError:
            if not _noted_missing:
                logger.info("compiled execution-time model not built (`make compiled`): using pure Python")
                _noted_missing = True
            return False
        prefill = self.times.prefill
        try:
            timer = StageTimer(
                linear_ms=self._linear,
                kv_save_ms=self._kv_save,
                send_recv_ms=self._send_recv,
                decode_ms=self._decode,
                chunk_sizes=prefill.chunk_sizes.tolist(),
                kv_points=[points.tolist() for points in prefill.kv_points],
                prefill_ms=[times.tolist() for times in prefill.times_ms],
                kv_granularity=self._granularity,
                decode_overhead=self._decode_overhead,
                prefill_overhead=self._prefill_overhead,
                num_layers=self.num_layers,
            )
        except ValueError as exc:  # a grid the C lookups do not take (prefix lengths not increasing)
            logger.info("compiled execution-time model not used for %s: %s", self.times.source, exc)
            return False
        for name in _COMPILED_METHODS:
            setattr(self, name, getattr(timer, name))
        return True

    def __getstate__(self) -> dict:
        # The compiled methods do not pickle; the copy binds its own.
        return {k: v for k, v in self.__dict__.items() if k not in _COMPILED_METHODS}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.compiled = self._use_compiled()

    def _token_ms(self, num_tokens: int) -> float:
        last = self._last_token
        rounded = (num_tokens + 7) // 8 * 8
        if rounded > last:
            return self._linear[last] + self._kv_save[min(num_tokens, last)]
        return self._linear[rounded] + self._kv_save[num_tokens]

    def _decode_ms(self, batch_size: int, mean_kv: int) -> float:
        row = self._decode[batch_size]
        bucket = -(-mean_kv // self._granularity)
        value = row[bucket] if bucket < len(row) else row[-1]
        return value * (1.0 + self._decode_overhead) if batch_size > 1 else value

    def stage_seconds(
        self,
        num_tokens: int,
        decode_batch_size: int,
        decode_kv_sum: int,
        prefills: list[tuple[int, int]],
        is_last_stage: bool = True,
    ) -> float:
        """Time of one stage: `prefills` holds (tokens already cached, chunk size) per prefill."""
        layer_ms = self._token_ms(num_tokens)
        if decode_batch_size:
            layer_ms += self._decode_ms(decode_batch_size, decode_kv_sum // decode_batch_size)
        if prefills:
            granularity = self._granularity
            if len(prefills) == 1:
                cached, chunk = prefills[0]
                layer_ms += self.times.prefill.lookup(-(-cached // granularity) * granularity, chunk)
            else:
                kv_sum = 0
                squares = 0
                for cached, chunk in prefills:
                    kv_sum += -(-cached // granularity) * granularity
                    squares += chunk * chunk
                value = self.times.prefill.lookup(kv_sum, round(sqrt(squares)))
                layer_ms += value * (1.0 + self._prefill_overhead)
        stage_ms = self.num_layers * layer_ms
        if not is_last_stage:
            stage_ms += self._send_recv[min((num_tokens + 7) // 8 * 8, len(self._send_recv) - 1)]
        return stage_ms * 1e-3

    def decode_run(self, batch_size: int, decode_kv_sum: int, num_iterations: int) -> list[tuple[int, float]]:
        """Times of `num_iterations` consecutive decode-only iterations of an unchanged batch.

        Every sequence gains one token per iteration, so the mean KV length rises by exactly one
        and its bucket changes once per `kv_granularity` iterations: the run is a few pieces of
        (iterations, seconds per iteration), whose sum equals the per-iteration sum.
        """
        base_ms = self._token_ms(batch_size)
        granularity = self._granularity
        mean_kv = decode_kv_sum // batch_size
        pieces: list[tuple[int, float]] = []
        remaining = num_iterations
        while remaining > 0:
            bucket = -(-mean_kv // granularity)
            count = min(bucket * granularity - mean_kv + 1, remaining)
            seconds = self.num_layers * (base_ms + self._decode_ms(batch_size, mean_kv)) * 1e-3
            pieces.append((count, seconds))
            mean_kv += count
            remaining -= count
        return pieces

    def chunk_run(
        self, decode_batch_size: int, decode_kv_sum: int, cached: int, chunk: int, num_iterations: int
    ) -> list[tuple[int, float]]:
        """Times of consecutive iterations in which one prefill takes the same chunk beside the decodes."""
        return [
            (
                1,
                self.stage_seconds(
                    decode_batch_size + chunk,
                    decode_batch_size,
                    decode_kv_sum + j * decode_batch_size,
                    [(cached + j * chunk, chunk)],
                ),
            )
            for j in range(num_iterations)
        ]
