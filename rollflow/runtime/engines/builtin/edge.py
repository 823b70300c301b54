"""What the built-in engine's route modules share at the HTTP edge: the errors that become a 400
or a 503, and the body parser that turns bad fields into one message naming them."""

from __future__ import annotations

from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from rollflow.errors import UserError
from rollflow.runtime.http.body import read_json_object
from rollflow.runtime.http.errors import BadRequest, errors_as_json

ModelT = TypeVar("ModelT", bound=BaseModel)


class MemoryReleased(Exception):
    """A request that needs the model while its memory is released: a 503 (come back later)."""


def require_memory(released: frozenset[str]) -> None:
    """Raise MemoryReleased (a 503) while the engine has given memory back (`released` regions)."""
    if released:
        raise MemoryReleased(
            "the engine has released its memory; POST /resume_memory_occupation before using it"
        )


async def parse(request: web.Request, model: type[ModelT], limit: int, allow_empty: bool = False) -> ModelT:
    """The validated body; bad bytes (rollflow.runtime.http.body) and bad fields are a 400."""

    def check(data: dict[str, Any]) -> ModelT:
        if not data and allow_empty:
            return model()
        return validate(model, data)

    return await read_json_object(request, limit, check)


def validate(model: type[ModelT], data: dict[str, Any]) -> ModelT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        message = message.removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


ERRORS_AS_JSON = errors_as_json({UserError: 400, MemoryReleased: 503})
"""The engine's middleware: a UserError from a layer below is a 400, released memory a 503."""
