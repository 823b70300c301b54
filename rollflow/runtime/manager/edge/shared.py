"""What every route module of the manager's HTTP API shares: the app keys, the 400/404 errors in the
one error shape, the 503 of a journal that cannot write, and body parsing (bad bytes and bad fields are a 400 naming the problem)."""

from __future__ import annotations

from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from rollflow.config import describe_validation_error
from rollflow.runtime.http.body import Narrow, read_json_object
from rollflow.runtime.http.errors import BadRequest, http_error
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.service import RolloutManager

BodyT = TypeVar("BodyT", bound=BaseModel)

MANAGER_KEY = web.AppKey("manager", RolloutManager)
TOKENIZER_KEY = web.AppKey("tokenizer", object)


def not_found(message: str) -> web.HTTPNotFound:
    return http_error(web.HTTPNotFound, message)


def body_limit(request: web.Request) -> int:
    return body_limit_of(request.app)


def body_limit_of(app: web.Application) -> int:
    return int(app[MANAGER_KEY].config.max_body_mb * (1 << 20))


def validate(model: type[BodyT], data: Any) -> BodyT:
    """`data` as `model`, or a 400 naming every field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message = describe_validation_error(model, exc, prefix="invalid request: ")
        raise BadRequest(
            message.replace(": : Value error, ", ": ").replace(": Value error, ", ": ")
        ) from None


async def parse_body(request: web.Request, model: type[BodyT], narrow: Narrow | None = None) -> BodyT:
    """The body as `model` (a 400 naming what is wrong); `narrow`: a tighter limit (`read_body`)."""
    return await read_json_object(request, body_limit(request), lambda data: validate(model, data), narrow)


def journal_writable(manager: RolloutManager) -> None:
    """A 503 naming the journal's error while it cannot write: a batch or session begun now would not
    survive a restart (what runs already goes on and finishes)."""
    error = manager.journal.error
    if error is not None:
        message = (
            f"{error}; new batches and sessions are refused until it writes again (GET /health says when)"
        )
        raise http_error(web.HTTPServiceUnavailable, message, headers={"Retry-After": "5"})


def config(request: web.Request) -> ManagerConfig:
    return request.app[MANAGER_KEY].config
