"""YAML files plus dotted command-line overrides -> validated pydantic models, with one-line errors.

    rollflow sim serve --config examples/sim/demo.yaml cluster.replicas=4 scheduler.kind=vllm

A bad key or value is reported as `config error: <dotted.key>: <what is wrong> (got <value>)`,
with the allowed keys or values when pydantic knows them.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rollflow.errors import UserError

ModelT = TypeVar("ModelT", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, models are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(UserError):
    """A config file or override that cannot be used; the message is meant for the user as is."""


def load_config(model_cls: type[ModelT], path: str | Path | None, overrides: list[str] = ()) -> ModelT:
    raw: dict[str, Any] = {}
    if path is not None:
        import yaml  # here, not at the top: a config built from flags never reads YAML (15 ms)

        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config error: file not found: {path}")
        try:
            raw = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config error: {path} is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config error: {path} must hold a mapping at the top level")
    for override in overrides:
        apply_override(raw, override)
    return validate_config(model_cls, raw)


def validate_config(model_cls: type[ModelT], raw: dict[str, Any]) -> ModelT:
    try:
        return model_cls.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(model_cls, exc)) from None


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Set `a.b.c=value` in a nested dict (`a.0.b` indexes a list); the value is parsed as YAML
    (so 4 is an int, [1,2] a list)."""
    key, sep, text = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"config error: override {override!r} is not of the form key.path=value")
    parts = key.strip().split(".")
    node: dict | list = raw
    for part in parts[:-1]:
        if isinstance(node, list):
            node = _list_item(node, part, key)
            continue
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict | list):
            raise ConfigError(f"config error: {key}: {part!r} holds a value, not a section")
        node = child
    import yaml

    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    if isinstance(node, list):
        node[_list_index(node, parts[-1], key)] = value
    else:
        node[parts[-1]] = value


def _list_index(items: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"config error: {key}: {part!r} is not an index of a list of {len(items)} entries")
    return int(part)


def _list_item(items: list, part: str, key: str) -> dict | list:
    item = items[_list_index(items, part, key)]
    if not isinstance(item, dict | list):
        raise ConfigError(f"config error: {key}: entry {part} holds a value, not a section")
    return item


def describe_validation_error(
    model_cls: type[BaseModel], exc: ValidationError, prefix: str = "config error: "
) -> str:
    """Every problem in one message, each naming its dotted key (shared by configs and HTTP bodies)."""
    lines = []
    for error in exc.errors():
        dotted, fields = _walk_location(model_cls, error["loc"])
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            name = str(error["loc"][-1])
            close = difflib.get_close_matches(name, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            lines.append(f"{dotted}: unknown key{hint} (allowed keys: {', '.join(sorted(fields))})")
            continue
        if not dotted:  # a check across sections: its message names the keys itself
            lines.append(message.removeprefix("Value error, "))
            continue
        got = error.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        lines.append(f"{dotted}: {message}{shown}")
    return prefix + "\n  ".join(lines)


def _walk_location(model_cls: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str, list[str]]:
    """Dotted user-facing key for a pydantic location, and the keys allowed beside the last one.

    Pydantic puts the tag of a discriminated union into the location (`workload.trace.file`);
    users wrote `workload.file`, so tags are dropped while walking the model tree.
    """
    parts: list[str] = []
    current: Any = model_cls
    fields: list[str] = list(model_cls.model_fields)
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
            current = _item_type(current)
            continue
        if typing.get_origin(current) is dict:  # a user's name for an entry, e.g. cluster.devices.<name>
            parts.append(str(item))
            current = _item_type(current)
            fields = sorted({f for m in _model_options(current) for f in m.model_fields})
            continue
        options = _model_options(current)
        chosen = next((m for m in options if item in m.model_fields), None)
        if chosen is None:
            tagged = next((m for m in options if _tag_of(m) == item), None)
            if tagged is not None:
                current = tagged
                fields = list(tagged.model_fields)
                continue
            parts.append(str(item))
            fields = sorted({f for m in options for f in m.model_fields})
            current = None
            continue
        fields = list(chosen.model_fields)
        parts.append(str(item))
        current = chosen.model_fields[item].annotation
    return ".".join(parts).replace(".[", "["), fields


def _model_options(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _model_options(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _model_options(arg)]
    return []


def _item_type(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    return args[-1] if args else None


def _tag_of(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    if field is None:
        return None
    args = typing.get_args(field.annotation)
    return args[0] if args else None
