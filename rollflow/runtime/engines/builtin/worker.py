"""The built-in engine's generation thread: one decode step per running request, round robin.

Every request keeps its own transformers KV cache, so requests of any length interleave without
padding, and a request's tokens depend only on its own sequence: a request resumed from prompt +
generated prefix produces, greedily, exactly the tokens the uninterrupted one would have; sampled,
too, when it carries its seed (each draw is seeded by the seed and the token's position). All engine
state is owned by this thread; the HTTP side talks to it only through `submit`, `abort`, `pause`,
`resume`, `load_weights` and `release_memory`/`resume_memory`, which queue a command that the
thread runs between two decode steps (so an abort lands within one step of one request). Each
produced token is handed back through the request's `emit` callback, with the weight version that
produced it.

Releasing memory (SGLang's `release_memory_occupation`, for a device handed to the trainer) drops
the model and every KV cache; weights changed since start-up are first written to a backup file,
so that resuming rebuilds the model from its folder and restores exactly the version it served.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rollflow.runtime.engines.builtin import DEFAULT_MAX_RUNNING_REQUESTS, DEFAULT_PREFIX_CACHE_TOKENS
from rollflow.runtime.engines.builtin.prefix_cache import PrefixCache
from rollflow.runtime.engines.builtin.sampling import GREEDY_BELOW, position_seed, sample_next_token
from rollflow.runtime.wire.base import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    """What the generation thread reports for a request: one new token, its end, or both."""

    # the new token and its logprob; None when the request ends without a new token (abort)
    token_id: int | None
    logprob: float | None
    # weight version of the model that produced the token
    weight_version: int
    # SGLang's finish_reason dict ({"type": "stop"|"length"|"abort", ...}); None while running
    finish_reason: dict[str, Any] | None = None
    # prompt tokens whose KV came from the prefix cache instead of being computed
    cached_tokens: int = 0


@dataclass
class Sequence:
    """One request's state inside the generation thread."""

    rid: str
    # prompt followed by every generated token
    token_ids: list[int]
    sampling: SamplingParams
    # called from the generation thread with each event; must be thread-safe and non-blocking
    emit: Callable[[TokenEvent], None]
    generator: torch.Generator | None = None
    seed: int = 0  # of the sampler; each draw reseeds `generator` with (seed, position)
    num_generated: int = 0
    # KV cache of token_ids[:num_cached]; None means the next step prefills the whole sequence
    past_key_values: Any = None
    num_cached: int = 0
    # prompt tokens the prefix cache supplied at its first step
    cached_tokens: int = 0

    @property
    def generated(self) -> list[int]:
        return self.token_ids[len(self.token_ids) - self.num_generated :]


class EngineFault(RuntimeError):
    """The model cannot run at all (a tensor-parallel rank died): every request ends with an
    abort that blames the engine, never the request."""


Decode = Callable[[list[int], SamplingParams], str]
"""Token ids -> text as the request asked it decoded (the stop strings are matched in it)."""


class GenerationWorker:
    """Owns the model and runs every request on one thread; the other threads send it commands."""

    def __init__(
        self,
        model: Any,
        eos_token_ids: set[int],
        weight_version: int,
        seed: int,
        decode: Decode | None = None,
        max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        reload_model: Callable[[], Any] | None = None,
    ) -> None:
        """`decode` turns output tokens into text for stop strings; without it they are refused.
        `reload_model` builds the model afresh from its folder (what resuming after a release
        runs); None: the engine cannot release its memory."""
        self._model = model
        self._reload_model = reload_model
        # memory regions given back ("weights", "kv_cache"); changed only by the generation thread
        self._released: frozenset[str] = frozenset()
        # the weights differ from the model folder's (a load happened): a release must back them up
        self._weights_changed = False
        self._eos_token_ids = eos_token_ids
        self._decode = decode
        self.max_running_requests = max_running_requests
        # changed only by the generation thread: requests decoding, and those waiting (first come,
        # first served) for one of the `max_running_requests` places
        self._running: dict[str, Sequence] = {}
        self._waiting: deque[Sequence] = deque()
        # (running, waiting, tokens in the KV caches), replaced whole by the generation thread
        # after every change so another thread reads one consistent triple
        self._load_snapshot = (0, 0, 0)
        # KV of prompt prefixes for later requests that share them; None when disabled
        self._prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        # (prompt tokens looked up, served from the cache, computed by prefills): replaced whole
        self._cache_stats = (0, 0, 0)
        self._paused = False
        self._weight_version = weight_version
        self._seeds = torch.Generator().manual_seed(seed)
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="rollflow-engine-worker", daemon=True)

    # ---- API for other threads -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def paused(self) -> bool:
        return self._paused

    def load(self) -> tuple[int, int, int]:
        """(requests running, requests waiting, tokens held in KV caches), as of the last step."""
        return self._load_snapshot

    def cache_stats(self) -> tuple[int, int, int]:
        """(prompt tokens looked up in the prefix cache, tokens it served, tokens prefills computed)."""
        return self._cache_stats

    @property
    def released(self) -> frozenset[str]:
        """Memory regions given back by `release_memory`; empty while the engine can serve."""
        return self._released

    @property
    def can_release(self) -> bool:
        return self._reload_model is not None

    def weights_bytes(self) -> int:
        """Bytes of parameters and buffers the engine holds now (0 once its weights are released)."""
        model = self._model
        if model is None:
            return 0
        tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def num_cached_sequences(self) -> int:
        """Requests holding a KV cache now."""
        return sum(1 for seq in list(self._running.values()) if seq.past_key_values is not None)

    def submit(self, seq: Sequence) -> None:
        self._commands.put(lambda: self._add(seq))

    def abort(self, rid: str, message: str = "aborted by request") -> None:
        self._commands.put(lambda: self._finish_aborted([rid], message))

    def abort_all(self, message: str = "aborted by request") -> None:
        self._commands.put(lambda: self._finish_aborted(self._all_rids(), message))

    def pause(self, mode: str) -> Future[None]:
        return self._call(lambda: self._pause(mode))

    def resume(self) -> Future[None]:
        return self._call(self._resume)

    def load_weights(
        self,
        tensors: dict[str, torch.Tensor],
        weight_version: int,
        prepare: Callable[[], None] | None = None,
    ) -> Future[None]:
        """Copy `tensors` (already checked against the model) into the model between two steps.
        `prepare` runs first, in the same step (a tensor-parallel commit); if it raises, nothing
        is copied and the Future carries its exception."""
        return self._call(lambda: self._load(tensors, weight_version, prepare))

    def run(self, fn: Callable[[], None]) -> Future[None]:
        """Run `fn` on the generation thread between two steps (where tensor-parallel commands go)."""
        return self._call(fn)

    def flush_prefix_cache(self) -> Future[None]:
        """Forget every cached prompt prefix (SGLang's /flush_cache); running requests keep their KV."""
        return self._call(lambda: self._prefix_cache is not None and self._prefix_cache.clear())

    def release_memory(self, tags: frozenset[str], backup: Path) -> Future[None]:
        """Abort every running request and drop the regions in `tags` ("weights", "kv_cache");
        changed weights are saved to `backup` first."""
        return self._call(lambda: self._release(tags, backup))

    def resume_memory(self, tags: frozenset[str], backup: Path) -> Future[None]:
        """Take the regions in `tags` back: the model is rebuilt from its folder, plus `backup`."""
        return self._call(lambda: self._resume_memory(tags, backup))

    def stop(self) -> None:
        self._commands.put(self._stop)
        self._thread.join(timeout=10)

    # ---- generation thread ----------------------------------------------------------------
    def _call(self, fn: Callable[[], None]) -> Future[None]:
        done: Future[None] = Future()

        def run() -> None:
            try:
                fn()
            except Exception as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

        self._commands.put(run)
        return done

    def _run(self) -> None:
        with torch.inference_mode():
            while not self._stopped:
                self._run_commands(block=self._paused or not (self._running or self._waiting))
                self._admit()
                for seq in list(self._running.values()):
                    if self._stopped or self._paused:
                        break
                    if seq.rid in self._running:
                        self._step_alone(seq)
                    self._run_commands(block=False)
                self._publish_load()

    def _admit(self) -> None:
        """Move waiting requests into the places that finished requests freed."""
        while self._waiting and len(self._running) < self.max_running_requests:
            seq = self._waiting.popleft()
            self._running[seq.rid] = seq
        self._publish_load()

    def _publish_load(self) -> None:
        kv_tokens = sum(seq.num_cached for seq in self._running.values())
        self._load_snapshot = (len(self._running), len(self._waiting), kv_tokens)

    def _all_rids(self) -> list[str]:
        return [*self._running, *(seq.rid for seq in self._waiting)]

    def _run_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return
        while True:
            command()
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, seq: Sequence) -> None:
        if self._released:
            seq.emit(self._abort_event("the engine has released its memory (resume_memory_occupation first)"))
            return
        if seq.rid in self._running or any(waiting.rid == seq.rid for waiting in self._waiting):
            seq.emit(self._abort_event(f"request id {seq.rid!r} is already running"))
            return
        if seq.sampling.temperature >= GREEDY_BELOW:
            seed = seq.sampling.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
            try:
                seq.generator = torch.Generator().manual_seed(seed)
                seq.seed = seed
            except (RuntimeError, OverflowError) as exc:
                seq.emit(self._request_error_event(f"sampling_seed {seed} cannot seed a generator: {exc}"))
                return
        if seq.sampling.stop and self._decode is None:
            seq.emit(self._request_error_event("stop strings need a tokenizer, which this engine lacks"))
            return
        if seq.sampling.max_new_tokens == 0:
            seq.emit(TokenEvent(None, None, self._weight_version, {"type": "length", "length": 0}))
            return
        self._waiting.append(seq)
        self._admit()

    def _step_alone(self, seq: Sequence) -> None:
        """`_step`, where an exception ends this request with an error and never the thread.

        The HTTP edge refuses every input it knows the model cannot take, so an exception here is
        a request the edge let through: the thread dying with it would take every other request
        and the engine's health down, and a manager resuming the request elsewhere would then take
        the next engine down the same way.
        """
        try:
            self._step(seq)
        except EngineFault as exc:
            logger.error("the model cannot run: %s", exc)
            self._finish_aborted(self._all_rids(), f"the engine failed: {exc}")
        except Exception as exc:
            logger.exception("request %s failed in the generation thread; the engine carries on", seq.rid)
            if self._running.pop(seq.rid, None) is not None:
                self._publish_load()
                seq.emit(
                    self._request_error_event(f"request failed in the engine: {type(exc).__name__}: {exc}")
                )

    def _step(self, seq: Sequence) -> None:
        """Run the model on the tokens not yet in the cache and append one sampled token."""
        cache = self._prefix_cache
        prefilling = seq.past_key_values is None
        if prefilling and cache is not None:  # start from the longest cached prefix
            seq.num_cached, seq.past_key_values = cache.lookup(seq.token_ids)
            if seq.num_generated == 0:
                seq.cached_tokens = seq.num_cached
        num_new = len(seq.token_ids) - seq.num_cached
        new_ids = torch.tensor([seq.token_ids[seq.num_cached :]], dtype=torch.long, device=self._model.device)
        out = self._model(input_ids=new_ids, past_key_values=seq.past_key_values, use_cache=True)
        seq.past_key_values = out.past_key_values
        seq.num_cached = len(seq.token_ids)
        if prefilling:
            if cache is not None:
                cache.insert(seq.token_ids, seq.past_key_values)
            looked_up, hits = (cache.num_lookup_tokens, cache.num_hit_tokens) if cache is not None else (0, 0)
            self._cache_stats = (looked_up, hits, self._cache_stats[2] + num_new)
        if seq.generator is not None:
            seq.generator.manual_seed(position_seed(seq.seed, len(seq.token_ids)))
        # on the CPU in float32 whatever the model's device and dtype: one sampler everywhere
        logits = out.logits[0, -1].float().cpu()
        token_id, logprob = sample_next_token(
            logits, seq.sampling, seq.generator, seq.generated, self._banned(seq)
        )
        seq.token_ids.append(token_id)
        seq.num_generated += 1
        finish = self._finish_reason(seq, token_id)
        if finish is not None:
            if cache is not None:  # the answer's KV too: an agent's next turn resends it
                cache.insert(seq.token_ids[: seq.num_cached], seq.past_key_values)
            del self._running[seq.rid]
            self._publish_load()  # a client told the request is over sees it gone from the load
        seq.emit(TokenEvent(token_id, logprob, self._weight_version, finish, seq.cached_tokens))

    def _banned(self, seq: Sequence) -> set[int]:
        """Tokens that would end the request before its min_new_tokens: they cannot be drawn."""
        params = seq.sampling
        if seq.num_generated >= params.min_new_tokens:
            return set()
        return set(params.stop_token_ids) | (set() if params.ignore_eos else self._eos_token_ids)

    def _finish_reason(self, seq: Sequence, token_id: int) -> dict[str, Any] | None:
        params = seq.sampling
        if seq.num_generated >= params.min_new_tokens:
            if token_id in params.stop_token_ids or (
                token_id in self._eos_token_ids and not params.ignore_eos
            ):
                return {"type": "stop", "matched": token_id}
            if params.stop:
                # a stop string ending at the new token lies within its last few tokens (a token is
                # at least one byte, a character at most four); earlier ones would have stopped it
                window = 4 * max(len(stop) for stop in params.stop) + 4
                text = self._decode(seq.generated[-window:], params)
                matched = next((stop for stop in params.stop if stop in text), None)
                if matched is not None:
                    return {"type": "stop", "matched": matched}
        if seq.num_generated >= params.max_new_tokens:
            return {"type": "length", "length": seq.num_generated}
        return None

    def _abort_event(self, message: str) -> TokenEvent:
        return TokenEvent(None, None, self._weight_version, {"type": "abort", "message": message})

    def _request_error_event(self, message: str) -> TokenEvent:
        """The end of a request that failed on its own input: SGLang's abort with a 400 status_code,
        which tells a router the request is at fault, not the engine."""
        finish = {"type": "abort", "message": message, "status_code": 400, "err_type": "BadRequest"}
        return TokenEvent(None, None, self._weight_version, finish)

    def _finish_aborted(self, rids: list[str], message: str) -> None:
        wanted = set(rids)
        waiting = [seq for seq in self._waiting if seq.rid in wanted]
        if waiting:
            self._waiting = deque(seq for seq in self._waiting if seq.rid not in wanted)
        ended = [*(self._running.pop(rid) for rid in rids if rid in self._running), *waiting]
        self._admit()  # publishes the load before the clients hear of the ends
        for seq in ended:
            seq.emit(self._abort_event(message))

    def _pause(self, mode: str) -> None:
        if mode == "abort":
            self._finish_aborted(self._all_rids(), "aborted by pause_generation")
        elif mode == "retract":
            self._drop_caches()
        self._paused = True

    def _resume(self) -> None:
        self._paused = False

    def _load(
        self, tensors: dict[str, torch.Tensor], weight_version: int, prepare: Callable[[], None] | None
    ) -> None:
        if prepare is not None:
            prepare()
        params = self._model.state_dict()
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
        self._weight_version = weight_version
        self._weights_changed = True
        # The caches hold keys and values of the old weights: recompute them with the new ones.
        self._drop_caches()
        logger.info("loaded %d tensors, weight version %d", len(tensors), weight_version)

    def _release(self, tags: frozenset[str], backup: Path) -> None:
        if self._reload_model is None:
            raise RuntimeError("this engine was started without a way to reload its model")
        self._finish_aborted(self._all_rids(), "aborted: the engine releases its memory")
        if "weights" in tags and self._model is not None:
            if self._weights_changed:
                from safetensors.torch import save_file

                # clones: tied tensors share storage, which safetensors refuses to write twice
                save_file({n: t.detach().clone() for n, t in self._model.state_dict().items()}, backup)
            self._model = None
        if self._prefix_cache is not None:
            self._prefix_cache.clear()  # its keys and values are KV memory too
        self._released = self._released | tags
        gc.collect()
        if torch.cuda.is_initialized():  # hand the freed blocks back to the device, not torch's cache
            torch.cuda.empty_cache()
        logger.info("released %s", ", ".join(sorted(tags)))

    def _resume_memory(self, tags: frozenset[str], backup: Path) -> None:
        if "weights" in tags and self._model is None:
            model = self._reload_model()
            if self._weights_changed:
                from safetensors.torch import load_file

                params = model.state_dict()
                for name, tensor in load_file(backup).items():
                    params[name].copy_(tensor)
                backup.unlink()
            self._model = model
        self._released = self._released - tags
        logger.info("resumed %s at weight version %d", ", ".join(sorted(tags)), self._weight_version)

    def _drop_caches(self) -> None:
        if self._prefix_cache is not None:
            self._prefix_cache.clear()
        for seq in self._running.values():
            seq.past_key_values = None
            seq.num_cached = 0

    def _stop(self) -> None:
        self._finish_aborted(self._all_rids(), "engine is shutting down")
        self._stopped = True
