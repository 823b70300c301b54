"""Configuration of a serving capacity search (`rollflow sim search`), validated at load time."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollflow.config import StrictModel
from rollflow.perf.specs import GPUS
from rollflow.policy.routing import ROUTERS

# `tbt` is accepted as a name for rollflow's per-output-token decode time (`tpot`), which is
# what a time-between-tokens SLO bounds on average over a request.
SLO_METRICS = {
    "ttft": "ttft",
    "tbt": "tpot",
    "tpot": "tpot",
    "e2e": "e2e",
    "scheduling_delay": "scheduling_delay",
}


class SLO(StrictModel):
    """One latency bound: the `quantile` of `metric` over completed requests must be <= `max_s`."""

    metric: Literal[tuple(SLO_METRICS)]  # type: ignore[valid-type]
    """ttft, tbt (= tpot), tpot, e2e or scheduling_delay (Vidur's default: scheduling_delay p99)."""
    quantile: float = Field(99.0, gt=0.0, lt=100.0)
    """Percentile of the metric over completed requests (e.g. 50, 95, 99.9), by numpy's linear
    interpolation, as every summary.json reports it (the probes ask for it in output.percentiles)."""
    max_s: float = Field(gt=0.0)
    """The bound, in seconds."""

    @property
    def summary_metric(self) -> str:
        return SLO_METRICS[self.metric]

    @property
    def summary_key(self) -> str:
        return f"p{self.quantile:g}"

    @property
    def name(self) -> str:
        return f"{self.summary_metric}_{self.summary_key}"


class SearchSpace(StrictModel):
    """Every list is one knob; the search tries their cross product."""

    device: list[str] = Field(["a100"], min_length=1)
    """Catalog devices (a100, h100, a40) or ones described under `simulation.cluster.devices`."""
    tensor_parallel: list[int] = Field([1], min_length=1)
    """Tensor-parallel degrees tried."""
    pipeline_stages: list[int] = Field([1], min_length=1)
    """Pipeline stage counts tried."""
    replicas: list[int] = Field([1], min_length=1)
    """Replica counts tried."""
    scheduler: list[Literal["vllm", "sarathi", "orca"]] = Field(["sarathi"], min_length=1)
    """Batch schedulers tried."""
    batch_size_cap: list[int] = Field([128], min_length=1)
    """Largest batch sizes tried."""
    chunk_size: list[int] = Field([512], min_length=1)
    """sarathi only: vllm and orca configurations do not multiply by it."""
    router: list[Literal[tuple(ROUTERS)]] = Field(["round_robin"], min_length=1)  # type: ignore[valid-type]
    """Routers tried."""

    @field_validator("tensor_parallel", "pipeline_stages", "replicas", "batch_size_cap", "chunk_size")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values):
            raise ValueError(f"every value must be >= 1 (got {values})")
        return values


class BisectionConfig(StrictModel):
    start_qps: float = Field(1.0, gt=0.0)
    """First QPS tried; doubled while the SLOs hold, then bisected."""
    max_qps: float = Field(1024.0, gt=0.0)
    """Highest QPS tried."""
    tolerance: float = Field(0.05, gt=0.0, lt=1.0)
    """Stop when (failing - passing) / failing QPS is at most this."""
    max_simulations: int = Field(20, ge=2)
    """Per configuration."""


class ServeSearchConfig(StrictModel):
    simulation: dict[str, Any] = Field(default_factory=dict)
    """A `rollflow sim serve` config (inline) the knobs and the QPS are written into. Its workload
    must be synthetic with poisson or gamma arrivals (lengths may come from a trace, as in
    Vidur's search), so the search can set its rate."""
    slos: list[SLO] = Field(min_length=1)
    """The latency bounds every configuration must meet at its highest QPS."""
    prices: dict[str, float] = Field(min_length=1)
    """$ per GPU-hour, by device."""
    space: SearchSpace = Field(default_factory=SearchSpace)
    """The knobs whose cross product is searched."""
    bisection: BisectionConfig = Field(default_factory=BisectionConfig)
    """How each configuration's highest QPS under the SLOs is found."""
    backend: Literal["local", "ray"] = "local"
    """local: a process pool on this machine; ray: tasks on the cluster at RAY_ADDRESS."""
    workers: int = Field(2, ge=1)
    """local: processes running configurations at once."""
    output_dir: str = "outputs/search"
    """Folder for results.csv, results.json, best.yaml, the Pareto plots and the cache of finished
    configurations."""

    @model_validator(mode="after")
    def _priced(self) -> ServeSearchConfig:
        cluster = self.simulation.get("cluster")
        user = cluster.get("devices") if isinstance(cluster, dict) else None
        known = [*GPUS, *(user if isinstance(user, dict) else {})]
        unknown = [d for d in self.space.device if d not in known]
        if unknown:
            raise ValueError(
                f"space.device: unknown device {unknown[0]!r}; pick from: {', '.join(known)}, "
                "or describe it under simulation.cluster.devices"
            )
        missing = [d for d in self.space.device if d not in self.prices]
        if missing:
            raise ValueError(f"prices: no $/GPU-hour for device {missing[0]!r}")
        if any(p <= 0 for p in self.prices.values()):
            raise ValueError("prices: every $/GPU-hour must be > 0")
        return self
