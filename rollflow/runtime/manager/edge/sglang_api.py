"""SGLang's serving routes on the manager, as sgl-router serves them to slime, AReaL, SkyRL and verl.

POST /generate        one prompt (JSON answer or SSE stream) or a batch (a list of prompts: a list
                      of answers); every sample is tracked, routed and resumed by the manager
POST /abort_request   {"rid": ...} or {"abort_all": true} (the token, when set): the sample (a
                      session's turn too) ends with finish_reason abort and the tokens it has
                      (SGLang's meta_info), and is not resumed. The rid of a `/generate` or a
                      session's turn is open (a client aborts its own requests, as on SGLang);
                      a batch sample's id needs the token too: that sample is the trainer's
GET  /v1/loads        the load the manager holds per worker (sgl-router's aggregate), and its queue
GET  /get_load        per worker, in the fields of SGLang's older per-rank list

A request whose own input an engine refuses (a token outside the vocabulary, a prompt too long for
the model) is answered with that 4xx and the engine's message, not a 200 with nothing in it.
"""

from __future__ import annotations

import asyncio
import datetime
import re
from typing import Any

from aiohttp import web

from rollflow.runtime.http.answer import dumps, json_response
from rollflow.runtime.http.auth import require_bearer
from rollflow.runtime.http.body import THREAD_PARSE_BYTES, Narrow, read_json_object
from rollflow.runtime.http.errors import BadRequest
from rollflow.runtime.http.json_object import parse_json_object
from rollflow.runtime.http.sse import close_sse, open_sse
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.samples import Sample, SampleState, Watcher
from rollflow.runtime.manager.core.service import RolloutManager
from rollflow.runtime.manager.edge import sessions_api
from rollflow.runtime.manager.edge.generate_io import (
    StreamEvents,
    check_prompt,
    generate_payload,
    one_prompt_limit,
    sampling_params,
)
from rollflow.runtime.manager.edge.protocol import GenerateBody
from rollflow.runtime.manager.edge.shared import (
    MANAGER_KEY,
    TOKENIZER_KEY,
    body_limit,
    parse_body,
    validate,
)
from rollflow.runtime.wire.base import SamplingParams
from rollflow.runtime.wire.sglang import MAX_TOKEN_ID, AbortBody, split_batch

RIDS_KEY = web.AppKey("rids", dict)
"""rid of a running `/generate` -> its sample, for `/abort_request`."""
TEMPLATES_MAX = 256  # body shapes the lean path remembers
MAX_RID_CHARS = 256  # GenerateBody.rid's max_length
_INT = frozenset({int})
routes = web.RouteTableDef()


_PROMPT_START = re.compile(rb'"input_ids"\s*:\s*\[\s*([\[\d-])')


def generate_limit(config: ManagerConfig) -> Narrow:
    """`/generate`'s limit from its body's start: a body whose `input_ids` are one prompt (not a
    batch, `[[`) is held to `one_prompt_bytes`; a text prompt or a batch, to the body limit."""

    def narrow(head: bytes) -> tuple[int, str] | None:
        found = _PROMPT_START.search(head)  # a JSON string cannot hold `"input_ids"` unescaped
        if found is None or found.group(1) == b"[":
            return None
        return one_prompt_limit(config)

    return narrow


class PromptRequest:
    """One prompt of a /generate: its body, its sample and the rid clients abort it by."""

    def __init__(
        self,
        app: web.Application,
        body: GenerateBody,
        params: SamplingParams | None = None,
        own: tuple[list[int], str | None] | None = None,
    ) -> None:
        """`params`: `body.sampling_params.to_params()`, when the caller has it already. `own`: the
        request's input_ids and rid, when `body` stands for every body that differs from it only in
        those (`BodyTemplates`): no copy of the body is made per request."""
        manager = app[MANAGER_KEY]
        self.tokenizer = app[TOKENIZER_KEY]
        self.body = body
        self.rids: dict[str, Sample] = app[RIDS_KEY]
        input_ids, self.asked_rid = (body.input_ids, body.rid) if own is None else own
        if body.return_text_in_logprobs and self.tokenizer is None:
            raise BadRequest(
                "return_text_in_logprobs needs a tokenizer: start the manager with `tokenizer:` set"
            )
        if self.asked_rid is not None and self.asked_rid in self.rids:
            raise BadRequest(f"rid {self.asked_rid!r} is already in use by a running request")
        self.prompt = self._prompt(manager.config, input_ids)
        self.params = sampling_params(body.sampling_params, manager.config, params)
        self._events = StreamEvents()  # kept from one streamed event to the next
        self._streamed = -1  # the tokens of the stream's events so far

    def _prompt(self, config: ManagerConfig, input_ids: list[int] | None) -> list[int]:
        if self.body.text is not None:
            if self.tokenizer is None:
                raise BadRequest(
                    "text prompts need a tokenizer: start the manager with `tokenizer:` set, or send input_ids"
                )
            prompt = self.tokenizer.encode(self.body.text).ids
        else:
            prompt = list(input_ids)
        check_prompt(prompt, config, "the prompt")
        return prompt

    sample: Sample  # set by submit
    rid: str

    def submit(self, manager: RolloutManager, watcher: Watcher | None = None) -> Sample:
        self.sample = manager.submit_sample(
            self.prompt, self.params, self.body.allow_off_policy, watcher=watcher
        )
        self.rid = self.asked_rid or self.sample.sample_id
        self.rids[self.rid] = self.sample
        return self.sample

    def payload(self) -> dict:
        return generate_payload(self.sample, self.body, self.rid, self.tokenizer)

    @property
    def finished(self) -> bool:
        return self.sample.state >= SampleState.FINISHED

    def stream_can_open(self) -> bool:
        """Whether a stream of this request may open: it opens with the first tokens or the end, so
        a request an engine refuses is still answered with its 4xx, before any byte of a stream."""
        return bool(self.sample.output_ids) or self.finished

    def next_event(self, backlogged: bool = False) -> bytes | None:
        """The stream's next event (the whole output so far, as SGLang streams by default), or None
        when none is due: no tokens since the last event, or the reader is `backlogged` (the next
        event holds these tokens too). The end is always due."""
        num_tokens = len(self.sample.output_ids)
        if not self.finished and (backlogged or num_tokens <= self._streamed):
            return None
        self._streamed = num_tokens
        return self._events.event(self.sample, self.body, self.rid, self.tokenizer)

    def refusal(self) -> BadRequest | None:
        """The 4xx to answer when an engine refused the request's own input."""
        return BadRequest(self.sample.error or "refused") if self.sample.refused else None

    def release(self, manager: RolloutManager) -> None:
        self.rids.pop(self.rid, None)
        manager.release(self.sample)


async def _finished(manager: RolloutManager, sample: Sample) -> None:
    while sample.state < SampleState.FINISHED:
        await manager.wait_for_update(sample)


@routes.post("/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    manager = request.app[MANAGER_KEY]
    config = manager.config
    bodies, batched = await read_json_object(
        request, body_limit(request), lambda data: _generate_bodies(data, config), generate_limit(config)
    )
    if any(body.session_params is not None for body in bodies):  # a session's turn (sessions_api.py)
        if batched:
            raise BadRequest("session_params is served for one prompt per request, not a batch")
        return await sessions_api.generate_turn(request, bodies[0])
    requests = [PromptRequest(request.app, body) for body in bodies]  # every prompt checked before any runs
    if not batched and not bodies[0].stream:
        return web.Response(body=await answer_one(manager, requests[0]), content_type="application/json")
    for req in requests:
        req.submit(manager)
    try:
        if not batched:
            return await _stream(request, manager, requests[0])
        await asyncio.gather(*(_finished(manager, req.sample) for req in requests))
        refusal = next((r.refusal() for r in requests if r.refusal() is not None), None)
        if refusal is not None:
            raise refusal
        return json_response([req.payload() for req in requests])  # a batch answers a list, in prompt order
    finally:
        for req in requests:
            req.release(manager)


async def answer_one(manager: RolloutManager, req: PromptRequest) -> bytes:
    """The JSON answer of one prompt not streamed (a 4xx raised when an engine refused its input);
    the caller's task waits on the sample itself, with no task of its own."""
    req.submit(manager)
    try:
        await _finished(manager, req.sample)
        return final_answer(req)
    finally:
        req.release(manager)


def final_answer(req: PromptRequest) -> bytes:
    """The JSON answer of a prompt whose sample is final (a 4xx raised when an engine refused its
    input); the caller releases the request."""
    refusal = req.refusal()
    if refusal is not None:
        raise refusal
    return dumps(req.payload())


def lean_request(app: web.Application, raw: bytes) -> PromptRequest | None:
    """For the lean edge (lean.py), which answers it with `final_answer` or streams its
    `payload`s: the request of a `/generate` body that is one prompt and not a session's turn, with
    nothing in it to refuse; None for any other body, which `generate` then answers (errors
    included) through aiohttp. The caller has checked the body's size against the manager's limit."""
    if len(raw) > THREAD_PARSE_BYTES:
        return None
    try:
        data = parse_json_object(raw)
        known = app[TEMPLATES_KEY].get(data)
        if known is not None:
            template, params = known
            return PromptRequest(app, template, params, own=(data["input_ids"], data.get("rid")))
        bodies, batched = _generate_bodies(data)
        body = bodies[0]
        if batched or body.session_params is not None:
            return None
        request = PromptRequest(app, body)
        app[TEMPLATES_KEY].put(data, body, request.params)
        return request
    except Exception:  # nothing has run yet: aiohttp's route answers it, in its own words (or 500)
        return None


class BodyTemplates:
    """The lean path's validated `/generate` bodies, by everything in them but the prompt and rid.

    RL clients send thousands of bodies that differ only in `input_ids` (and `rid`): pydantic's
    validation of the rest (sampling params, flags, the neutral-field rules) and the sampling
    params built from it cost a tenth of the manager's CPU per request. Validation is a pure
    function of the body and checks `input_ids` and `rid` each on its own, so a body whose other
    fields equal (value and JSON type) those of one validated before is that body with its own
    prompt and rid, once those pass the same checks: ids all exact ints in range, not empty, and a
    rid a string of 1 to 256 characters. The request then holds the body seen before and its own
    prompt and rid beside it (`PromptRequest`'s `own`; a copy of a pydantic model costs about as
    much as validating it). Anything else (a float or bool id, which validation refuses, a text
    prompt) is validated in full, and only bodies the lean path serves are remembered."""

    def __init__(self, max_entries: int = TEMPLATES_MAX) -> None:
        self._max = max_entries
        self._known: dict[str, tuple[GenerateBody, SamplingParams]] = {}

    @staticmethod
    def _key(data: dict[str, Any]) -> str | None:
        """The key of a body with one prompt of token ids that need no conversion; None otherwise.

        The key is the `repr` of the rest of the body, one pass in C. For parsed JSON (dicts, lists,
        strings, ints, floats, bools, None) `repr` tells apart whatever validation tells apart: each
        value's type (`True == 1 == 1.0` in Python but not to pydantic, and their reprs differ),
        strings quoted, key order kept, and a float by its exact value (repr round-trips, and
        `-0.0` is not `0.0`)."""
        ids, rid = data.get("input_ids"), data.get("rid")
        if type(ids) is not list or not ids or not _INT.issuperset(map(type, ids)):
            return None
        if min(ids) < 0 or max(ids) > MAX_TOKEN_ID:
            return None
        if rid is not None and (type(rid) is not str or not 1 <= len(rid) <= MAX_RID_CHARS):
            return None
        rest = data.copy()
        del rest["input_ids"]
        rest.pop("rid", None)
        return repr(rest)

    def get(self, data: dict[str, Any]) -> tuple[GenerateBody, SamplingParams] | None:
        """A body seen before that `data` equals but for its `input_ids` and `rid` (which passed the
        same checks: `data` validates to it with those two fields its own), and its sampling params."""
        key = self._key(data)
        return self._known.get(key) if key is not None else None

    def put(self, data: dict[str, Any], body: GenerateBody, params: SamplingParams) -> None:
        """Remember a body validated in full, and its sampling params."""
        key = self._key(data)
        if key is None:
            return
        if len(self._known) >= self._max:
            self._known.clear()  # clients send few shapes: a full table means many, all alike rare
        self._known[key] = (body, params)


TEMPLATES_KEY = web.AppKey("generate_templates", BodyTemplates)


def _generate_bodies(data: dict, config: ManagerConfig | None = None) -> tuple[list[GenerateBody], bool]:
    """The body of each prompt, and whether they came as a batch (a batch of one answers a list).
    With `config`, a prompt of ids longer than max_prompt_tokens is refused before it is validated:
    its length is known at once, and validating millions of ids holds the GIL for long."""
    try:
        items = split_batch(data)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if config is not None:
        for index, item in enumerate(items or [data]):
            ids = item.get("input_ids")
            if type(ids) is list:
                check_prompt(ids, config, "the prompt" if items is None else f"input_ids[{index}]")
    if items is None:
        return [validate(GenerateBody, data)], False
    return [validate(GenerateBody, item) for item in items], True


async def _stream(request: web.Request, manager: RolloutManager, req: PromptRequest) -> web.StreamResponse:
    """SSE events with the whole output so far, as SGLang streams by default. The stream opens with
    the first tokens (or the end), so a request an engine refuses is still answered with its 4xx."""
    sample = req.sample
    while not req.stream_can_open():
        await manager.wait_for_update(sample)
    refusal = req.refusal()
    if refusal is not None:
        raise refusal
    response = await open_sse(request)
    while True:
        event = req.next_event()
        if event is not None:
            await response.write(event)
        if req.finished:
            break
        await manager.wait_for_update(sample)
    return await close_sse(response)


@routes.post("/abort_request")
async def abort_request(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    body = await parse_body(request, AbortBody)
    rids: dict[str, Sample] = {**manager.sessions.running_turns(), **request.app[RIDS_KEY]}
    batch_samples = list(manager.batches.samples())
    if body.abort_all:
        require_bearer(request, manager.config.token, "abort_all")  # it ends everyone's samples
        targets = [*rids.values(), *batch_samples]
        message = "aborted by abort_request (abort_all)"
    elif body.rid:
        sample = rids.get(body.rid)
        if sample is None:
            sample = next((s for s in batch_samples if s.sample_id == body.rid), None)
            if sample is not None:  # a trainer's sample, not the caller's own request
                require_bearer(request, manager.config.token, "aborting a batch's sample")
        targets = [sample] if sample is not None else []
        message = f"aborted by abort_request (rid {body.rid})"
    else:
        raise BadRequest("give rid, or abort_all: true")
    targets = [sample for sample in targets if sample.state < SampleState.FINISHED]
    for sample in targets:
        manager.abort_sample(sample, message)
    return web.json_response({"success": True, "num_aborted": len(targets)})


def _worker_loads(manager: RolloutManager) -> list[dict]:
    return [
        {
            "worker": engine.url,
            "id": engine.engine_id,
            "num_running_reqs": len(engine.running),
            "num_waiting_reqs": 0,
            "num_total_reqs": len(engine.running),
            "capacity": engine.capacity,
            "weight_version": engine.weight_version,
        }
        for engine in manager.registry.live()
    ]


@routes.get("/v1/loads")
async def loads(request: web.Request) -> web.Response:
    """sgl-router's aggregate of its workers' loads, from what the manager holds on each; samples
    waiting in the manager's own queue are `num_waiting_reqs` at the top."""
    manager = request.app[MANAGER_KEY]
    workers = _worker_loads(manager)
    return web.json_response(
        {
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
            "total_workers": len(workers),
            "successful": len(workers),
            "failed": 0,
            "num_waiting_reqs": len(manager.dispatcher),
            "num_running_reqs": sum(w["num_running_reqs"] for w in workers),
            "loads": workers,
        }
    )


@routes.get("/get_load")
async def get_load(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    return web.json_response(
        [
            {"worker": w["worker"], "num_reqs": w["num_running_reqs"], "num_waiting_reqs": 0}
            for w in _worker_loads(manager)
        ]
    )


def setup(app: web.Application) -> None:
    app[RIDS_KEY] = {}
    app[TEMPLATES_KEY] = BodyTemplates()
    app.add_routes(routes)
