"""The session routes of the manager (see sessions.py for what a session is):

POST   /v1/sessions                {session_id?, weight_version?, allow_off_policy?} -> the session
POST   /v1/sessions/{id}/turns     {input_ids, sampling_params, return_logprob?, rid?} -> the turn's output,
                                   SGLang's meta_info (cached_tokens, spans in the turn, weight_version)
GET    /v1/sessions/{id}           the whole context: ids, logprobs, loss_mask, segments, turns (token)
DELETE /v1/sessions/{id}           close it; answers the whole context once more (token)

SGLang's shapes of the same, for clients that drive SGLang's sessions (through sgl-router):

POST   /open_session               {capacity_of_str_len, session_id?} -> the session id (a JSON string)
POST   /generate                   with session_params {id, rid?}: the next turn, input_ids following
                                   the context (append only: offset, replace, drop_previous_output
                                   are refused; stream: false)
POST   /close_session              {session_id} -> an empty 200 (token)

A turn's `rid` (SGLang's `rid` on /generate) is its idempotency key: the same turn sent again (a
client whose connection died with a manager that restarted on its journal) answers the turn of that
rid, running or finished, rather than starting another; an open sent again with the same id and
settings (no turn yet) answers 200 with the session it made.

With a manager token set, reading or closing a session (GET and DELETE /v1/sessions/{id}, POST
/close_session) needs it. A session's context is a trajectory the trainer trains on, and closing
one ends its episode: they are the trainer's, as batches are. A session id is no capability that
could stand in for the token: the client chooses it (any 1 to 64 letters, digits, `_.-`, so
"episode-1" is as valid as a uuid), and it is written into every turn's sample id and the logs.
Opening a session and sending its turns stay open, as `/generate` is: an agent's tool loop drives
them without the trainer's token.

Errors: an unknown session is a 404; a closed or busy session, or a turn on a weight version no
engine serves (without allow_off_policy), a 409 that says what to do.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from rollflow.runtime.http.errors import BadRequest, http_error
from rollflow.runtime.manager.core.sessions import (
    SessionConflict,
    SessionNotFound,
    SessionStore,
    TooManySessions,
    Turn,
    TurnFailed,
)
from rollflow.runtime.manager.edge.generate_io import generate_payload, one_prompt_limit, sampling_params
from rollflow.runtime.manager.edge.protocol import (
    CloseSGLangSessionBody,
    GenerateBody,
    OpenSessionBody,
    OpenSGLangSessionBody,
    TurnBody,
)
from rollflow.runtime.manager.edge.shared import (
    MANAGER_KEY,
    TOKENIZER_KEY,
    journal_writable,
    not_found,
    parse_body,
)

SESSIONS_KEY = web.AppKey("sessions", SessionStore)
routes = web.RouteTableDef()


def _store(request: web.Request) -> SessionStore:
    return request.app[SESSIONS_KEY]


def _gone(request: web.Request) -> Callable[[], bool]:
    """Whether the request's connection is lost: its handler's cancel is then its caller's going away
    (aiohttp drops the transport before it cancels), not the manager's stopping."""
    return lambda: request.transport is None or request.transport.is_closing()


def _errors(exc: Exception) -> web.HTTPException:
    if isinstance(exc, SessionNotFound):
        return not_found(str(exc))
    if isinstance(exc, SessionConflict):
        return http_error(web.HTTPConflict, str(exc))
    if isinstance(exc, TooManySessions):
        return http_error(web.HTTPTooManyRequests, str(exc))
    if isinstance(exc, TurnFailed) and exc.refused:
        return BadRequest(str(exc))
    return http_error(web.HTTPBadGateway, str(exc))


@routes.post("/v1/sessions")
async def open_session(request: web.Request) -> web.Response:
    body = await parse_body(request, OpenSessionBody)
    journal_writable(request.app[MANAGER_KEY])
    try:
        session, created = await _store(request).open(
            body.session_id, body.weight_version, body.allow_off_policy
        )
    except (SessionConflict, TooManySessions) as exc:
        raise _errors(exc) from None
    answer = {
        "session_id": session.session_id,
        "weight_version": session.weight_version,
        "allow_off_policy": session.allow_off_policy,
    }
    return web.json_response(answer, status=201 if created else 200)


@routes.post("/v1/sessions/{session_id}/turns")
async def send_turn(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    store = _store(request)
    session_id = request.match_info["session_id"]
    limit = one_prompt_limit(manager.config)
    body = await parse_body(request, TurnBody, lambda head: limit)  # a turn's input is one prompt
    journal_writable(manager)
    params = sampling_params(body.sampling_params, manager.config)
    try:
        context = len(store.get(session_id).context_ids) + len(body.input_ids)
        if context > manager.config.max_prompt_tokens:
            raise BadRequest(
                f"the session's context would hold {context} tokens, above "
                f"max_prompt_tokens={manager.config.max_prompt_tokens}; close it and open a new one"
            )
        turn = await store.turn(session_id, body.input_ids, params, body.rid, caller_gone=_gone(request))
    except (SessionNotFound, SessionConflict, TurnFailed) as exc:
        raise _errors(exc) from None
    return web.json_response(turn_payload(session_id, turn, body.return_logprob))


def turn_payload(session_id: str, turn: Turn, return_logprob: bool) -> dict:
    """SGLang's /generate answer for the turn's output, with the session's place of it."""
    sample = turn.sample
    meta: dict = {
        "id": sample.sample_id,
        "prompt_tokens": len(sample.prompt_ids),
        "completion_tokens": len(sample.output_ids),
        "cached_tokens": sample.cached_tokens,
        "finish_reason": {"type": sample.finish_reason}
        if sample.finish_reason != "abort"
        else {"type": "abort", "message": sample.error},
        "weight_version": sample.weight_version,
        "spans": [span.to_json() for span in sample.spans],
        "resumes": sample.resumes,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [logprob, token, None]
            for logprob, token in zip(sample.output_logprobs, sample.output_ids, strict=True)
        ]
    return {
        "session_id": session_id,
        "turn": turn.index,
        "output_ids": list(sample.output_ids),
        "context_length": turn.output_start + len(sample.output_ids),
        "meta_info": meta,
    }


@routes.get("/v1/sessions/{session_id}")
async def get_session(request: web.Request) -> web.Response:
    try:
        session = _store(request).get(request.match_info["session_id"])
    except SessionNotFound as exc:
        raise _errors(exc) from None
    return web.json_response(session.to_json())


@routes.delete("/v1/sessions/{session_id}")
async def close_session(request: web.Request) -> web.Response:
    try:
        session = await _store(request).close(request.match_info["session_id"])
    except (SessionNotFound, SessionConflict) as exc:
        raise _errors(exc) from None
    return web.json_response(session.to_json())


def setup(app: web.Application) -> None:
    app[SESSIONS_KEY] = app[MANAGER_KEY].sessions

    async def stopping(app: web.Application) -> None:  # before aiohttp cancels the turns' handlers
        app[SESSIONS_KEY].stop()

    app.on_shutdown.append(stopping)
    app.add_routes(routes)


# ------------------------------------------------------------------ SGLang's shapes of the same


@routes.post("/open_session")
async def open_sglang_session(request: web.Request) -> web.Response:
    """SGLang's `/open_session`: answers the session id as a JSON string."""
    body = await parse_body(request, OpenSGLangSessionBody)
    journal_writable(request.app[MANAGER_KEY])
    try:
        session, _ = await _store(request).open(body.session_id)
    except (SessionConflict, TooManySessions) as exc:
        raise _errors(exc) from None
    return web.json_response(session.session_id)


@routes.post("/close_session")
async def close_sglang_session(request: web.Request) -> web.Response:
    """SGLang's `/close_session`: an empty 200."""
    body = await parse_body(request, CloseSGLangSessionBody)
    try:
        await _store(request).close(body.session_id)
    except (SessionNotFound, SessionConflict) as exc:
        raise _errors(exc) from None
    return web.Response()


async def generate_turn(request: web.Request, body: GenerateBody) -> web.Response:
    """A `/generate` with `session_params`: the session's next turn, answered as SGLang answers it
    (the turn's output only; `meta_info.id` is the rid the next turn continues)."""
    manager = request.app[MANAGER_KEY]
    if body.stream:
        raise BadRequest("session_params with stream: true is not served; send stream: false")
    if body.input_ids is None:
        raise BadRequest("session_params needs input_ids (a session's turns are token ids)")
    journal_writable(manager)
    params = sampling_params(body.sampling_params, manager.config)
    store = _store(request)
    session_params = body.session_params
    try:
        turn = await store.turn(
            session_params.id, list(body.input_ids), params, body.rid, session_params.rid, _gone(request)
        )
    except (SessionNotFound, SessionConflict, TurnFailed) as exc:
        raise _errors(exc) from None
    payload = generate_payload(turn.sample, body, turn.rid, request.app[TOKENIZER_KEY])
    return web.json_response(payload)
