"""What an engine says it holds right now, read from its load or metrics endpoint.

Three sources, one record:
- SGLang's `/v1/loads` (`{"loads": [one object per data-parallel rank]}`, with `num_running_reqs`,
  `num_waiting_reqs`, `num_used_tokens`, `max_total_num_tokens`, `token_usage`), and the older
  `/get_load` (a list per rank of `num_reqs` (running + waiting), `num_waiting_reqs`, `num_tokens`,
  which gives no KV capacity). The built-in engine serves both shapes.
- vLLM's Prometheus `/metrics`: the gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`
  and `vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` before vLLM 0.10), one sample per
  engine, summed (KV averaged) over engines; and the counters `vllm:prefix_cache_hits` over
  `vllm:prefix_cache_queries` (prompt tokens, exposed with Prometheus' `_total` suffix): the prefix
  cache's hit rate since the server started.

Parsers raise ValueError on a body of the wrong shape, so a client can tell "this engine has no
such endpoint" (None) from "it answered nonsense" (an error).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # newest name first
VLLM_PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_HITS = "vllm:prefix_cache_hits_total"
VLLM_SAMPLES = (VLLM_RUNNING, VLLM_WAITING, *VLLM_KV_USAGE, VLLM_PREFIX_QUERIES, VLLM_PREFIX_HITS)


@dataclass(frozen=True)
class EngineLoad:
    """An engine's own count of what it holds, summed over its data-parallel ranks."""

    # requests admitted: holding KV, prefilling or decoding
    num_running: int
    # requests received and waiting in the engine's queue to be admitted
    num_queued: int
    # fraction of the KV cache in use, 0..1; None when the engine does not say
    kv_usage: float | None
    # prompt tokens served from the prefix cache over those looked up, since the engine started;
    # None when it does not say or has looked up none
    prefix_hit_rate: float | None = None


def parse_sglang_loads(payload: Any) -> EngineLoad:
    """SGLang's `/v1/loads` body; KV use is the used tokens over the capacity of every rank."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("loads"), list):
        raise ValueError(f"expected an object with a 'loads' list, got {str(payload)[:200]}")
    ranks = [_mapping(rank) for rank in payload["loads"]]
    used = sum(_count(rank, "num_used_tokens") for rank in ranks)
    capacity = sum(_count(rank, "max_total_num_tokens") for rank in ranks)
    if capacity > 0:
        kv_usage: float | None = used / capacity
    else:  # a rank that gives its usage as a fraction only
        shares = [rank["token_usage"] for rank in ranks if _is_number(rank.get("token_usage"))]
        kv_usage = sum(shares) / len(shares) if shares else None
    hit_rates = [rank["cache_hit_rate"] for rank in ranks if _is_number(rank.get("cache_hit_rate"))]
    return EngineLoad(
        num_running=sum(_count(rank, "num_running_reqs") for rank in ranks),
        num_queued=sum(_count(rank, "num_waiting_reqs") for rank in ranks),
        kv_usage=_fraction(kv_usage),
        prefix_hit_rate=_fraction(sum(hit_rates) / len(hit_rates)) if hit_rates else None,
    )


def parse_sglang_get_load(payload: Any) -> EngineLoad:
    """SGLang's older `/get_load` body: one object (or a list, one per rank); `num_reqs` counts the
    waiting requests too, and `num_tokens` comes without the capacity, so KV use is unknown."""
    ranks = [_mapping(rank) for rank in (payload if isinstance(payload, list) else [payload])]
    waiting = sum(_count(rank, "num_waiting_reqs") for rank in ranks)
    total = sum(_count(rank, "num_reqs") for rank in ranks)
    return EngineLoad(num_running=max(0, total - waiting), num_queued=waiting, kv_usage=None)


def parse_vllm_metrics(text: str) -> EngineLoad:
    """vLLM's Prometheus exposition: the running/waiting gauges summed over engines, KV use averaged,
    the prefix cache's hits over its queries summed over engines."""
    samples: dict[str, list[float]] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in VLLM_SAMPLES:
            samples.setdefault(name, []).append(_metric_value(line))
    if VLLM_RUNNING not in samples or VLLM_WAITING not in samples:
        raise ValueError(f"no {VLLM_RUNNING} / {VLLM_WAITING} gauges in the metrics")
    usage = next((samples[name] for name in VLLM_KV_USAGE if name in samples), None)
    queries = sum(samples.get(VLLM_PREFIX_QUERIES, []))
    hits = sum(samples.get(VLLM_PREFIX_HITS, []))
    return EngineLoad(
        num_running=int(sum(samples[VLLM_RUNNING])),
        num_queued=int(sum(samples[VLLM_WAITING])),
        kv_usage=_fraction(sum(usage) / len(usage)) if usage else None,
        prefix_hit_rate=_fraction(hits / queries) if queries > 0 else None,
    )


def sglang_loads_body(
    num_running: int, num_queued: int, num_used_tokens: int, max_total_num_tokens: int
) -> dict[str, Any]:
    """A one-rank `/v1/loads` body in SGLang's shape (what the built-in engine serves)."""
    usage = num_used_tokens / max_total_num_tokens if max_total_num_tokens else 0.0
    return {
        "dp_rank_count": 1,
        "loads": [
            {
                "dp_rank": 0,
                "num_running_reqs": num_running,
                "num_waiting_reqs": num_queued,
                "num_used_tokens": num_used_tokens,
                "max_total_num_tokens": max_total_num_tokens,
                "token_usage": round(usage, 6),
            }
        ],
    }


def sglang_get_load_body(num_running: int, num_queued: int, num_used_tokens: int) -> list[dict[str, int]]:
    """The same load in the older `/get_load` shape (one rank)."""
    return [
        {
            "dp_rank": 0,
            "num_reqs": num_running + num_queued,
            "num_waiting_reqs": num_queued,
            "num_tokens": num_used_tokens,
        }
    ]


def _metric_value(line: str) -> float:
    """The value of `name{labels} value [timestamp]` or `name value [timestamp]`."""
    rest = line[line.rindex("}") + 1 :] if "{" in line else line.split(" ", 1)[-1]
    try:
        return float(rest.split()[0])
    except (ValueError, IndexError):
        raise ValueError(f"unreadable metrics line {line[:200]!r}") from None


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"expected an object per rank, got {str(value)[:200]}")
    return value


def _count(rank: Mapping[str, Any], key: str) -> int:
    value = rank.get(key, 0)
    if not _is_number(value) or value < 0:
        raise ValueError(f"{key} must be a non-negative number, got {value!r}")
    return int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fraction(value: float | None) -> float | None:
    return None if value is None else min(1.0, max(0.0, float(value)))
