"""An engine as a router sees it: the simulator's `InstanceView`, filled from what the engine holds.

Every field means what it means for a simulated replica (see `rollflow/policy/view.py`), so a policy
tuned or learned in the simulator reads the same numbers live:

- `num_running` / `num_queued`: requests admitted (holding KV) / waiting in the engine's own queue.
  The engine's last load report (SGLang's `/v1/loads`, vLLM's `/metrics`, the built-in engine's
  `/v1/loads`; polled every `load_poll_interval_s`) counts every request, the manager's and any
  other client's, wherever the engine queues them. Between two reports the manager moves the counts
  itself for what it does (optimistic increments, as sgl-router's load tracking): a sample it
  dispatches counts as queued on its engine at once, its first token moves it to running, the end
  of its attempt takes it off. So a burst routed before the next report still spreads, as arrivals
  do in the simulator, where a routed request waits in the replica's queue until admitted.
- `queued_tokens`: prompt (plus tokens already generated, for a resumed sample) and expected output
  tokens (its remaining `max_new_tokens`) of the manager's samples on the engine with no token yet;
  `running_tokens`: the remaining output tokens of those already generating (their prompt is done),
  as the simulator's resident requests' `total - processed`. Engines report no per-request lengths,
  so requests of other clients add to the counts and the KV use, not to these.
- `kv_usage`: the engine's reported fraction of KV cache in use (SGLang's used over total tokens,
  vLLM's `kv_cache_usage_perc`); for an engine that reports none, the manager's samples over its
  `capacity`, the closest share the manager knows.
- `tokens_per_s`: tokens the manager received from the engine over the last health interval.
- `cached_tokens` (filled for routers that read it, as in the simulator): prompt tokens of the
  request being routed that the engine probably caches, from the manager's record of the prompts
  it sent there (`prefixes.py`); the simulator's is its exact prefix cache.

A sample with no token yet may already be prefilling in the engine: it counts as queued until its
first token (or the next report) says otherwise, as a simulated request counts as waiting until its
batch is formed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import aiohttp

from rollflow.policy.view import ClusterView, InstanceView, RouteRequest, id_only_view
from rollflow.runtime.deadline import within
from rollflow.runtime.engines.base import EngineError
from rollflow.runtime.manager.core.prefixes import BLOCK_TOKENS, prefix_key, session_key
from rollflow.token_blocks import block_hashes

if TYPE_CHECKING:
    from rollflow.runtime.manager.core.registry import EngineRecord
    from rollflow.runtime.manager.core.samples import Sample

log = logging.getLogger(__name__)


async def refresh_load(engine: EngineRecord, timeout_s: float) -> None:
    """Ask the engine for its load report; without an answer, the view falls back to the manager's
    own counts until the next one (the health check decides whether the engine is gone)."""
    asked = engine.own_counts()
    try:
        report = await within(engine.client.load(), timeout_s)
    except (EngineError, aiohttp.ClientError, OSError, TimeoutError) as exc:
        log.debug("engine %d gave no load report: %s", engine.engine_id, exc)
        report = None
    engine.reported, engine.own_at_report = report, asked


def route_inputs(
    sample: Sample, engines: Sequence[EngineRecord], now: float, reads_cache: bool, reads_load: bool = True
) -> tuple[RouteRequest, ClusterView]:
    """What a router is given for one sample: the request (with its prefix key: its GRPO group, its
    session, or its whole prompt) and the view of the eligible engines, each with the prompt tokens it
    probably caches (from the manager's record of what it sent where) when the router reads them.
    A router that declares `reads_load = False` (round robin, random: ids and order only) gets views
    of ids and kinds with the loads left at zero, as the simulator gives it, and a request without
    its prefix key, which it does not read either: no engine's load is computed and no prompt
    hashed. Any other gets every engine's view as it is now. Either way the view is frozen."""
    key = 0
    if reads_load:
        key = (
            prefix_key(sample.batch_id, sample.group_index, sample.prompt_ids)
            if sample.session_id is None
            else session_key(sample.session_id)
        )
    request = RouteRequest(
        sample.seq, len(sample.prompt_ids) + len(sample.output_ids), sample.remaining_tokens, key
    )
    if not reads_load:
        instances = tuple([id_only_view(e.engine_id, e.kind) for e in engines])
    elif reads_cache:
        hashes = block_hashes(sample.prompt_ids, BLOCK_TOKENS)
        instances = tuple([instance_view(e, e.prefixes.cached_tokens(hashes)) for e in engines])
    else:
        instances = tuple([instance_view(e) for e in engines])
    return request, ClusterView(now, instances)


def instance_view(engine: EngineRecord, cached_tokens: int = 0) -> InstanceView:
    """The engine now: its last report moved by the manager's own changes since it was asked for."""
    own_queued = len(engine.unstarted)
    own_running = len(engine.running) - own_queued
    report = engine.reported
    if report is None:
        num_running, num_queued = own_running, own_queued
        kv_usage = len(engine.running) / engine.capacity
    else:
        running_then, queued_then = engine.own_at_report
        num_running = max(0, report.num_running + own_running - running_then)
        num_queued = max(0, report.num_queued + own_queued - queued_then)
        kv_usage = report.kv_usage if report.kv_usage is not None else len(engine.running) / engine.capacity
    # Positional, in InstanceView's field order: a view is built per engine per routed sample.
    return InstanceView(
        engine.engine_id,
        num_running,
        num_queued,
        engine.queued_tokens,
        engine.running_tokens,
        min(1.0, kv_usage),
        engine.tokens_per_s,
        engine.kind,
        engine.weight_version or 0,
        cached_tokens,
    )
