"""A router trained by `rollflow router train`, run with numpy alone (no torch at decision time).

The policy scores every instance with one small MLP shared across instances and picks the
highest score. An instance's input is its own load (from the `ClusterView`), its position in
the view (so a policy trained for one cluster learns which slots are fast GPUs), the cluster's
mean load, and the arriving request's lengths. The same `encode_observation` feeds the
Gymnasium environment during training and this router at run time, so what the policy saw in
the simulator is what it sees in the live manager.

An instance's eight load features, each meaning the same in the simulator (a replica's scheduler)
and live (`rollflow/runtime/manager/core/view.py`: the engine's load report plus the manager's own
dispatches since):
1. queued requests: routed to the instance, not yet admitted (live: in the engine's queue, or
   sent and without a token yet)
2. running requests: admitted, holding KV (prefilling or decoding)
3. queued tokens: prompt + expected output tokens of the queued requests
4. running tokens: tokens the running requests still have to process (live: their remaining
   `max_new_tokens`; their prompts are done)
5. KV use: fraction of the KV cache in use (live: the engine's report, SGLang's used/total tokens,
   vLLM's `kv_cache_usage_perc`)
6. measured generation throughput, tokens/s
7. token load: queued + running tokens
8. seconds to drain the token load at the measured throughput

    router = load_learned_router("examples/router/heterogeneous.policy.npz")
    router = make_router("learned", path="examples/router/heterogeneous.policy.npz")  # same thing
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rollflow.errors import UserError
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest

NUM_INSTANCE_FEATURES = 8  # load features; a spec with `cache_feature` adds one
NUM_REQUEST_FEATURES = 2
FORMAT_VERSION = 1
MAX_FEATURE = 50.0  # features are log-scaled; the clip only guards against absurd inputs


@dataclass(frozen=True)
class ObservationSpec:
    """How a snapshot becomes numbers; stored in the policy file so training and serving agree."""

    num_instances: int
    token_scale: float = 1024.0  # tokens are fed as log1p(tokens / token_scale)
    request_scale: float = 16.0  # request counts as log1p(count / request_scale)
    throughput_scale: float = 1000.0  # tokens/s as log1p(tokens_per_s / throughput_scale)
    use_predicted_output: bool = True  # feed the request's expected output length (else 0)
    cache_feature: bool = False  # feed each instance's cached share of the prompt (files before it: off)

    @property
    def num_instance_features(self) -> int:
        return NUM_INSTANCE_FEATURES + self.cache_feature

    @property
    def size(self) -> int:
        return self.num_instances * self.num_instance_features + NUM_REQUEST_FEATURES


def encode_features(
    request: RouteRequest, view: ClusterView, spec: ObservationSpec
) -> tuple[list[list[float]], list[float]]:
    """Log-scaled features of each instance (in view order) and of the request, as Python floats.

    Plain Python arithmetic: at four to sixteen instances it beats numpy, whose per-call overhead
    dominates arrays this small (the router's latency budget is tens of microseconds).
    """
    if len(view.instances) != spec.num_instances:
        raise UserError(
            f"learned router was trained for {spec.num_instances} instances, the view has {len(view.instances)}"
        )
    return _instance_rows(view.instances, spec, request), _request_row(request, spec)


def _instance_rows(
    instances: Sequence[InstanceView], spec: ObservationSpec, request: RouteRequest
) -> list[list[float]]:
    tokens, count, rate_scale = 1.0 / spec.token_scale, 1.0 / spec.request_scale, 1.0 / spec.throughput_scale
    rows = []
    for inst in instances:
        load = inst.queued_tokens + inst.running_tokens
        rate = inst.tokens_per_s
        raw = (
            inst.num_queued * count,
            inst.num_running * count,
            inst.queued_tokens * tokens,
            inst.running_tokens * tokens,
            inst.kv_usage,
            rate * rate_scale,
            load * tokens,
            load / rate if rate > 0 else 0.0,  # seconds to drain the load at the measured rate
        )
        row = [_squash(v) for v in raw]
        if spec.cache_feature:  # a share, 0..1: the view's cached tokens over the prompt
            row.append(min(1.0, inst.cached_tokens / request.prompt_tokens) if request.prompt_tokens else 0.0)
        rows.append(row)
    return rows


def _request_row(request: RouteRequest, spec: ObservationSpec) -> list[float]:
    output = request.expected_output_tokens if spec.use_predicted_output else 0
    return [_squash(request.prompt_tokens / spec.token_scale), _squash(output / spec.token_scale)]


def _squash(value: float) -> float:
    return min(math.log1p(value), MAX_FEATURE) if value > 0 else 0.0


def encode_observation(request: RouteRequest, view: ClusterView, spec: ObservationSpec) -> np.ndarray:
    """The flat float32 observation of the routing env: every instance's features, then the request's."""
    rows, req = encode_features(request, view, spec)
    return np.array([v for row in rows for v in row] + req, dtype=np.float32)


class LearnedRouter:
    """Greedy routing by an exported scorer MLP: tanh hidden layers, one score per instance."""

    name = "learned"

    def __init__(self, spec: ObservationSpec, weights: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.spec = spec
        self.reads_cache = spec.cache_feature  # the simulator fills the view's cached_tokens for it
        layers = [(w.astype(np.float32), b.astype(np.float32)) for w, b in weights]
        n, f = spec.num_instances, spec.num_instance_features
        w0, b0 = layers[0]
        # The first layer's inputs are [own | slot one-hot | mean | request]: the one-hot rows
        # become a per-slot bias, the rest one matrix over rows [own | mean | request].
        self._w_first = np.concatenate([w0[:f], w0[f + n :]], axis=0)
        self._slot_bias = w0[f : f + n] + b0
        self._layers = layers[1:]

    def _last_hidden(self, x: np.ndarray) -> np.ndarray:
        hidden = np.tanh(x @ self._w_first + self._slot_bias)
        for w, b in self._layers[:-1]:
            hidden = np.tanh(hidden @ w + b)
        return hidden

    def scores(self, obs: np.ndarray) -> np.ndarray:
        """Score of each instance for one flat observation (the env's); the argmax is the pick."""
        n, f = self.spec.num_instances, self.spec.num_instance_features
        per = obs[: n * f].reshape(n, f)
        tail = np.concatenate([per.mean(axis=0), obs[n * f :]])
        w, b = self._layers[-1]
        rows = np.concatenate([per, np.broadcast_to(tail, (n, len(tail)))], axis=1)
        return (self._last_hidden(rows) @ w + b)[:, 0]

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        """The best-scoring instance. A view of every trained instance is read by position (as in
        training); a smaller one (a manager routing among eligible engines) by `instance_id` as
        the slot, with the mean load taken over the instances present."""
        instances = view.instances
        n = len(instances)
        slot_bias = (
            self._slot_bias if n == self.spec.num_instances else self._slot_bias[self._slots(instances)]
        )
        rows = _instance_rows(instances, self.spec, request)
        tail = [sum(column) / n for column in zip(*rows, strict=True)] + _request_row(request, self.spec)
        hidden = np.tanh(np.array([row + tail for row in rows], dtype=np.float32) @ self._w_first + slot_bias)
        for w, b in self._layers[:-1]:
            hidden = np.tanh(hidden @ w + b)
        scores = hidden @ self._layers[-1][0]  # the output bias is the same for every instance
        return instances[int(scores.argmax())].instance_id

    def _slots(self, instances: Sequence[InstanceView]) -> list[int]:
        ids = [inst.instance_id for inst in instances]
        n = self.spec.num_instances
        if not ids or len(set(ids)) != len(ids) or not all(0 <= i < n for i in ids):
            raise UserError(
                f"learned router was trained for {n} instances; a smaller view must use instance ids "
                f"0..{n - 1} (the trained slots), got {ids}"
            )
        return ids


def save_learned_router(
    path: str | Path, spec: ObservationSpec, weights: list[tuple[np.ndarray, np.ndarray]], info: dict
) -> Path:
    """Write the policy as one .npz: layer weights plus a JSON header (spec and training facts)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"format": FORMAT_VERSION, "spec": asdict(spec), "num_layers": len(weights), "info": info}
    arrays = {"header": np.array(json.dumps(header))}
    for k, (w, b) in enumerate(weights):
        arrays[f"w{k}"], arrays[f"b{k}"] = w, b
    with path.open("wb") as handle:
        np.savez(handle, **arrays)
    return path


def load_learned_router(path: str | Path) -> LearnedRouter:
    """Load a policy file written by `save_learned_router`; errors name the file and the problem."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"learned router file not found: {path}")
    try:
        with np.load(file, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            weights = [(data[f"w{k}"], data[f"b{k}"]) for k in range(header["num_layers"])]
    except (ValueError, KeyError, OSError) as exc:
        raise UserError(f"{path} is not a rollflow policy file: {exc}") from None
    if header.get("format") != FORMAT_VERSION:
        raise UserError(f"{path}: policy format {header.get('format')} is not {FORMAT_VERSION}")
    return LearnedRouter(ObservationSpec(**header["spec"]), weights)
