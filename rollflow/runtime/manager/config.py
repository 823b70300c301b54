"""`rollflow manager serve --config FILE`: every knob of the manager, validated up front."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from rollflow.config import StrictModel
from rollflow.policy.offload import OffloadConfig
from rollflow.policy.routing import ROUTERS
from rollflow.runtime.http.limits import BodyLimits

_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:.]+\]|[^\s:/\[\]]+):([0-9]{1,5})")  # an IPv6 host in brackets


def _relay_address(value: str) -> str:
    match = _HOST_PORT.fullmatch(value)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError(
            f"a relay is HOST:PORT of a `rollflow manager relay` (e.g. 10.0.0.2:30200), not {value!r}"
        )
    return value


RelayAddress = Annotated[str, AfterValidator(_relay_address)]


class EngineEntry(StrictModel):
    """An engine registered at start-up (more can join at run time via `POST /workers`)."""

    url: str
    """Where the engine answers, e.g. http://127.0.0.1:30000."""
    kind: Literal["local", "remote", "spot"] = "local"
    """local: a reserved engine; remote: one that local engines offload to; spot: preemptible, may
    vanish at any time (its samples resume elsewhere). The routers and the offload balancer read it."""
    engine_type: Literal["sglang", "vllm", "builtin"] = "sglang"
    """The API the engine speaks: SGLang's /generate (also rollflow's built-in engine), or vLLM's."""
    capacity: int = Field(64, ge=1)
    """Most samples in flight on this engine at once; more wait in the manager's queue."""
    api_key: str | None = None
    """The engine's --api-key, sent as a bearer token on every call to it."""
    relay: RelayAddress | None = None
    """HOST:PORT of a `rollflow manager relay` on the engine's node: its token streams are read
    there and reach the manager merged, once a `stream_flush_ms` (read here while the relay is down)."""


class OffloadSection(OffloadConfig):
    """Local (reserved) engines generate for a budget per batch, then their leftovers move to remote ones."""

    enabled: bool = False
    """Turns offloading on; off, every engine serves every batch as the router picks."""


class ManagerConfig(StrictModel):
    host: str = "127.0.0.1"
    """Address to listen on; 127.0.0.1 keeps the manager off the network (set a `token` before
    opening it to other machines)."""
    port: int = Field(30100, ge=0, le=65535)
    """Port to listen on; 0 picks a free one (printed at start)."""
    token: str | None = None
    """Bearer token required, when set, by every admin and trainer route: engines (POST/DELETE
    /workers..., /add_worker, /remove_worker), /abort_request with abort_all or a batch sample's id,
    batches (/batches...), POST /step_report, and reading or closing a session (GET and DELETE
    /v1/sessions/{id}, POST /close_session)."""
    router: Literal[tuple(ROUTERS)] = "least_outstanding"  # type: ignore[valid-type]
    """Routing policy, the same function the simulator runs (rollflow/policy/routing.py)."""
    router_path: str | None = None
    """Policy file of `router: learned` (an exported policy.npz; engine ids 0..N-1 are its slots)."""
    seed: int = 0
    """Seeds the `random` router's draws, so a run can be repeated."""
    resume: Literal["continue", "restart"] = "continue"
    """continue: resume from prompt + generated tokens; restart: regenerate from the prompt (for comparison)."""
    max_attempts: int = Field(8, ge=1)
    """Attempts per sample before it is reported failed (each engine failure or move is one)."""
    request_failures_to_fail: int = Field(2, ge=1)
    """Attempts ended by an engine's error for the request itself (an error event, or an abort the
    manager did not ask for) before the sample is failed with that error instead of resumed."""
    stall_timeout_s: float = Field(30.0, gt=0)
    """An engine that sends nothing to any of its streams for this long while it has samples is
    treated as hung; a sample waiting in a producing engine's own queue is not silent, however long."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """How long a connection to an engine may take before the call counts as failed."""
    engine_startup_timeout_s: float = Field(120.0, ge=0)
    """How long the manager waits at start for each engine of `engines:` to answer (they take
    seconds to load); past it, the manager exits naming the engine."""
    health_interval_s: float = Field(2.0, gt=0)
    """How often each engine's /health is asked."""
    load_poll_interval_s: float = Field(0.5, gt=0)
    """How often each engine is asked what it holds (SGLang's /v1/loads, vLLM's /metrics) for the
    routers' view; between two answers the manager counts what it dispatched itself."""
    health_failures_to_remove: int = Field(2, ge=1)
    """Failed health checks in a row that take an engine out of the pool (its samples resume elsewhere)."""
    breaker_pause_s: float = Field(30.0, gt=0)
    """Circuit breaker (as sgl-router's): a failed engine is set aside this long, then the health
    checker tries it again (half-open) and it rejoins if it answers healthy. The pause doubles with
    each failure in a row, up to `breaker_max_pause_s`; a sample finished on it resets the count."""
    breaker_max_pause_s: float = Field(300.0, gt=0)
    """Longest pause of the circuit breaker, however many failures in a row."""
    max_new_tokens_limit: int = Field(32768, ge=1)
    """Requests asking for more new tokens than this are rejected with a 400."""
    max_prompt_tokens: int = Field(131072, ge=1)
    """Longest prompt (a session's whole context too), a 400 above it. A body of one prompt of
    `input_ids` larger than 16 bytes per token plus 64 KiB is sure to be longer: it is refused with a
    413 once its first 64 KiB are read, never read whole."""
    read_timeout_s: float = Field(30.0, gt=0)
    """A connection that sends no whole request head, or pauses its body, this long is closed."""
    body_timeout_s: float = Field(300.0, gt=0)
    """A connection whose body has not all arrived this long after its head is closed."""
    min_body_bytes_per_s: float = Field(16384.0, gt=0)
    """A connection whose body, after its first `read_timeout_s`, has come at fewer bytes a second
    on average is closed (a client trickling a byte every few seconds holds no socket for long)."""
    max_body_mb: float = Field(64.0, gt=0)
    """Largest request body in MiB (413 above it); a batch of 64 prompts of 128k tokens fits."""
    request_log: str | None = None
    """JSONL file to append one line to per sample that ends (arrival, first token, finish, lengths,
    spans with their engines and times), for `rollflow sim replay --from-manager-log`. Off when unset."""
    tokenizer: str | None = None
    """Optional tokenizer folder: lets `/generate` accept `text` and answer with text."""
    journal: str | None = None
    """SQLite file (WAL mode) the manager journals its state to: batches, every sample's state and
    tokens, engines registered at run time, the offload balancer. A manager started on an existing
    journal carries on from it; unset, a manager that dies loses every batch in flight. One manager per
    journal: it locks `<journal>.lock` at start, and a second one on the same file refuses to start."""
    journal_flush_interval_ms: int = Field(50, ge=1, le=60_000)
    """How often the journal's writer thread commits what has gathered (its cost against a crash's loss)."""
    journal_max_unflushed_tokens: int = Field(4096, ge=1)
    """Most generated tokens waiting to be written: past it the writer commits at once and the manager's
    streams wait for it, so a crash loses at most this many of the tokens the manager had received
    (plus one chunk per running sample)."""
    max_open_sessions: int = Field(4096, ge=1)
    """Multi-turn sessions open at once; opening one more is a 429 until one is closed (each open
    session keeps its whole context in memory, and in the journal)."""
    processes: int = Field(1, ge=1, le=256)
    """OS processes the manager runs as. 1: one process does everything. N > 1: the first keeps the
    engines, batches, router, journal and HTTP API, and N - 1 stream processes read the engines'
    token streams (the per-token work: reading, parsing, merging events) on other cores."""
    stream_flush_ms: float = Field(10.0, gt=0, le=1000)
    """How often the engines' token streams are read and what they produced passed on, merged into
    one chunk per sample: by the manager itself (processes: 1, SGLang and built-in engines), by its
    stream processes (processes > 1) or by relays. A token reaches the manager's samples at most
    twice this long after its engine sent it; a stream process or relay killed takes with it at most
    twice this long of each of its samples' tokens (generated again when they resume); clients that
    stream see events at most this often per sample."""
    offload: OffloadSection = OffloadSection()
    """When local engines hand a batch's leftovers to remote ones (the balancer the simulator runs)."""
    engines: list[EngineEntry] = Field(default_factory=list)
    """Engines registered at start; more join at run time through POST /workers."""

    def body_limits(self) -> BodyLimits:
        return BodyLimits(self.read_timeout_s, self.body_timeout_s, self.min_body_bytes_per_s)

    @model_validator(mode="after")
    def _router_file(self) -> ManagerConfig:
        if self.router == "learned" and not self.router_path:
            raise ValueError("router: learned needs router_path set to an exported policy.npz")
        if self.router != "learned" and self.router_path:
            raise ValueError("router_path is only read by router: learned")
        if self.journal is not None and not self.journal.strip():
            raise ValueError("journal is empty: give a file path, or leave journal unset")
        return self
