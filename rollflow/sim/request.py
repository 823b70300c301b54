"""Simulated requests and batches: small slotted records, no object per token."""

from __future__ import annotations

from rollflow.sim.prefix_cache import Segments


class SimRequest:
    """One inference request as a replica sees it.

    `num_prefill`/`num_decode` are what is left to do from the current (re)start: a request
    preempted by recompute restarts with everything it has produced folded into its prompt,
    which is how vLLM recomputes (and how Vidur models it). `prompt_tokens`/`output_tokens`
    keep the original sizes for metrics.
    """

    __slots__ = (
        "arrived_at",
        "blocks",
        "cached_tokens",
        "completed_at",
        "decode_base",
        "hashes",
        "id",
        "num_decode",
        "num_prefill",
        "num_restarts",
        "output_tokens",
        "prefill_completed_at",
        "prefill_done",
        "prefix_key",
        "processed",
        "prompt_tokens",
        "replica_id",
        "scheduled_at",
        "segments",
        "shared",
    )

    def __init__(
        self,
        request_id: int,
        arrived_at: float,
        prompt_tokens: int,
        output_tokens: int,
        segments: Segments | None = None,
        prefix_key: int = 0,
    ) -> None:
        self.id = request_id
        self.arrived_at = arrived_at
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.num_prefill = prompt_tokens
        self.num_decode = output_tokens
        self.processed = 0  # tokens whose KV exists, plus the one token sampled at prefill end
        self.prefill_done = False
        self.blocks = 0  # KV blocks held on its replica (stale while in a DecodeCohort)
        self.decode_base = 0  # processed minus the cohort clock, while in a DecodeCohort
        self.num_restarts = 0
        self.replica_id = -1
        self.scheduled_at: float | None = None
        self.prefill_completed_at: float | None = None
        self.completed_at: float | None = None
        # prefix caching: token identity as (content id, length) segments over prompt + output
        self.segments: Segments = segments or ((-1 - request_id, prompt_tokens + output_tokens),)
        self.prefix_key = prefix_key  # what routers keep together: a GRPO group, a session
        self.hashes: list[int] | None = None  # full-block hashes, computed on first use
        self.shared: list[int] = []  # hashes of the cached blocks it references
        self.cached_tokens = 0  # prompt tokens its first admission found cached

    @property
    def total_tokens(self) -> int:
        return self.num_prefill + self.num_decode

    @property
    def completed(self) -> bool:
        return self.completed_at is not None

    def on_iteration_end(self, time: float, num_tokens: int) -> None:
        """Account `num_tokens` processed in one iteration that ended at `time`."""
        self.processed += num_tokens
        if not self.prefill_done and self.processed == self.num_prefill:
            self.prefill_done = True
            self.processed += 1  # the prefill pass samples the first output token
            if self.prefill_completed_at is None:
                self.prefill_completed_at = time
        if self.processed == self.num_prefill + self.num_decode:
            self.completed_at = time

    def restart(self) -> None:
        """Preempted by recompute: drop the KV; what was generated becomes prompt to re-prefill."""
        total = self.num_prefill + self.num_decode
        self.num_prefill = self.processed
        self.num_decode = total - self.processed
        self.processed = 0
        self.prefill_done = False
        self.num_restarts += 1


class IterationBatch:
    """Requests run together for `num_iterations` identical-shape iterations on one replica.

    A batch with more than one iteration is a run: every decoding request gains one token per
    iteration, a chunked prefill (at most one) the same chunk, and nothing else changes;
    `pieces` holds (iterations, seconds each). Decoding requests in a replica's DecodeCohort
    are carried as a count, not a list.
    """

    __slots__ = (
        "attention_pairs",
        "cohort_kv_sum",
        "cohort_size",
        "decode_kv_sum",
        "decode_size",
        "end_time",
        "last_stage_s",
        "num_iterations",
        "num_prefill_tokens",
        "num_tokens",
        "pieces",
        "prefill_pair_growth",
        "requests",
        "scheduled_at",
        "size",
        "stage_seconds",
        "tokens_per_iteration",
        "version",
        "wakeup_s",
    )

    def __init__(
        self,
        requests: list[SimRequest],
        num_tokens: list[int],
        cohort_size: int = 0,
        cohort_kv_sum: int = 0,
        num_prefill_tokens: int | None = None,
    ) -> None:
        """`num_prefill_tokens`: the tokens of the requests still prefilling, where the scheduler
        already counted them (summed here otherwise)."""
        self.requests = requests  # requests scheduled one by one (prefills; decodes outside a cohort)
        self.cohort_size = cohort_size  # decoding requests scheduled in aggregate (one token each)
        self.cohort_kv_sum = cohort_kv_sum  # their summed KV lengths at the first iteration
        self.num_tokens = num_tokens
        if num_prefill_tokens is None:
            num_prefill_tokens = 0
            for request, tokens in zip(requests, num_tokens, strict=True):
                if not request.prefill_done:
                    num_prefill_tokens += tokens
        self.num_prefill_tokens = num_prefill_tokens
        self.size = len(requests) + cohort_size
        self.tokens_per_iteration = sum(num_tokens) + cohort_size
        self.num_iterations = 1
        self.pieces: list[tuple[int, float]] = []
        self.scheduled_at = 0.0
        self.end_time = 0.0  # when the last stage finishes (set when the batch starts)
        self.stage_seconds: tuple[float, float] = (0.0, 0.0)  # (non-last stage, last stage)
        self.last_stage_s = 0.0  # the last stage's time for the whole batch (every iteration of a run)
        self.attention_pairs = 0  # prefill (query, key) pairs of the first iteration, for MFU
        self.prefill_pair_growth = 0  # how much those pairs grow per iteration of a chunk run
        self.decode_size = 0  # decoding requests, cohort and explicit (set when timed)
        self.decode_kv_sum = 0  # their summed KV lengths at the first iteration
        self.version = 0  # bumped when a decode run is cut short, to void its old end event
        self.wakeup_s = 0.0  # the replica's wake-up from idle before the batch starts (see Replica)
