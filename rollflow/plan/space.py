"""The configurations of a serving search: the knobs' cross product, and whether each fits."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from rollflow.perf.memory import max_resident_requests
from rollflow.perf.specs import MODELS, ModelSpec, ParallelLayout, validate_layout
from rollflow.plan.serve_config import SearchSpace
from rollflow.sim.config import SimConfig

KNOBS = (
    "device",
    "tensor_parallel",
    "pipeline_stages",
    "replicas",
    "scheduler",
    "batch_size_cap",
    "chunk_size",
    "router",
)


def expand(space: SearchSpace) -> list[dict[str, Any]]:
    """One dict of knob values per configuration; chunk_size only multiplies sarathi ones."""
    seen: set[tuple] = set()
    configs = []
    for values in itertools.product(*(getattr(space, knob) for knob in KNOBS)):
        knobs = dict(zip(KNOBS, values, strict=True))
        if knobs["scheduler"] != "sarathi":
            knobs["chunk_size"] = None
        key = tuple(knobs.values())
        if key not in seen:
            seen.add(key)
            configs.append(knobs)
    return configs


def config_key(knobs: dict[str, Any], base: dict[str, Any], slos: list[dict], bisection: dict) -> str:
    """Cache key: everything that decides a configuration's result."""
    text = json.dumps({"knobs": knobs, "base": base, "slos": slos, "bisection": bisection}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def apply_knobs(base: dict[str, Any], knobs: dict[str, Any], qps: float) -> dict[str, Any]:
    """The `rollflow sim serve` config of one configuration at one rate (a plain dict)."""
    raw = json.loads(json.dumps(base))
    cluster = raw.setdefault("cluster", {})
    cluster.update(
        device=knobs["device"],
        network_device=f"{knobs['device']}_pairwise_nvlink",
        tensor_parallel=knobs["tensor_parallel"],
        pipeline_stages=knobs["pipeline_stages"],
        replicas=knobs["replicas"],
        router=knobs["router"],
    )
    scheduler = raw.setdefault("scheduler", {})
    scheduler.update(kind=knobs["scheduler"], batch_size_cap=knobs["batch_size_cap"])
    if knobs["chunk_size"] is not None:
        scheduler["chunk_size"] = knobs["chunk_size"]
    raw.setdefault("workload", {}).setdefault("intervals", {})["qps"] = qps
    return raw


def unfit_reason(config: SimConfig) -> str | None:
    """Why a configuration cannot hold the model (sharding or memory), or None when it can."""
    cluster = config.cluster
    model = MODELS.get(cluster.model) or ModelSpec(cluster.model, **cluster.model_shape.model_dump())
    layout = ParallelLayout(cluster.tensor_parallel, cluster.pipeline_stages)
    try:
        validate_layout(model, layout)
        max_resident_requests(
            model, layout, cluster.gpu_spec(cluster.device), cluster.memory_margin_fraction, config.max_tokens
        )
    except ValueError as exc:
        return str(exc)
    return None
