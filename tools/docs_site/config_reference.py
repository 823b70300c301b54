"""`reference/config.md`: every key of every config file, read from the pydantic models.

A key's meaning is its field's `description`, else the docstring under the field (the form the
config modules use), else the comment on its line; a nested section's meaning is its model's
docstring. Sections that are a whole config of their own (the manager inside `launch:`, ...) link
to it rather than repeat it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import json
import re
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from tools.docs_site.markdown import cell, code, table


@dataclass(frozen=True)
class ConfigFile:
    title: str
    anchor: str
    model: str  # "module:Class"
    read_by: str  # the command(s) that read the file
    examples: str  # where example files are

    def load(self) -> type[BaseModel]:
        module, name = self.model.split(":")
        return getattr(importlib.import_module(module), name)


CONFIG_FILES = (
    ConfigFile(
        "Serving simulation",
        "sim",
        "rollflow.sim.config:SimConfig",
        "`rollflow sim serve`, `sim config`, `sim replay`",
        "examples/sim/",
    ),
    ConfigFile(
        "Serving capacity search",
        "sim-search",
        "rollflow.plan.serve_config:ServeSearchConfig",
        "`rollflow sim search`",
        "examples/search/",
    ),
    ConfigFile(
        "RL step simulation",
        "rl-sim",
        "rollflow.sim.rl.config:RLSimConfig",
        "`rollflow rl-sim run`, `rl-sim compare`",
        "examples/rl/",
    ),
    ConfigFile(
        "RL plan search",
        "rl-sim-search",
        "rollflow.plan.rl_config:RLSearchConfig",
        "`rollflow rl-sim search`",
        "examples/rl/",
    ),
    ConfigFile(
        "Learned router",
        "router",
        "rollflow.learn.config:LearnConfig",
        "`rollflow router ...`",
        "examples/router/",
    ),
    ConfigFile(
        "Rollout manager",
        "manager",
        "rollflow.runtime.manager.config:ManagerConfig",
        "`rollflow manager serve`",
        "examples/manager/",
    ),
    ConfigFile(
        "Trainer",
        "train",
        "rollflow.runtime.trainer.config:TrainConfig",
        "`rollflow train`",
        "examples/train/",
    ),
    ConfigFile(
        "Launch",
        "launch",
        "rollflow.runtime.launch.config:LaunchFile",
        "`rollflow launch up` (the file's `launch:` section)",
        "examples/launch/",
    ),
    ConfigFile(
        "Demo", "demo", "rollflow.runtime.demo.config:DemoFile", "`rollflow demo run`", "examples/demo/"
    ),
)


@dataclass(frozen=True)
class Link:
    """Where a section's keys are listed already: later uses of the section link there."""

    file: str  # the anchor of the config file it is listed in
    anchor: str
    label: str
    whole_file: bool = False


def page() -> str:
    files = [(spec, spec.load()) for spec in CONFIG_FILES]
    # a model that is a whole config file (or the one section of one) is linked, not repeated
    linked: dict[type, Link] = {}
    for spec, model in files:
        link = Link(spec.anchor, spec.anchor, f"the {spec.title.lower()} config", whole_file=True)
        linked[model] = link
        fields = model.model_fields
        if len(fields) == 1:
            (only,) = fields.values()
            if isinstance(only.annotation, type) and issubclass(only.annotation, BaseModel):
                linked[only.annotation] = link
    parts = [
        "# Config reference\n",
        "Generated from the pydantic models at build time: every key of every config file, with its "
        "type, default and meaning. Any key can be set on the command line as a dotted override "
        "(`cluster.replicas=4`; `a.0.b` indexes a list); a key that is not here is an error that "
        "names the keys allowed. `KEY[]` is a list of sections, `KEY.<name>` a mapping of them; a "
        "section listed once already links there. `rollflow sim config` and `rollflow router config` "
        "print a config with every default filled in.\n",
        table(
            ["file", "read by", "examples"],
            [(f"[{spec.title}](#{spec.anchor})", spec.read_by, code(spec.examples)) for spec, _ in files],
        ),
    ]
    for spec, model in files:
        parts.append(f"## {spec.title} {{#{spec.anchor}}}\n")
        parts.append(f"Read by {spec.read_by}; model `{spec.model.replace(':', '.')}`.\n")
        if _doc(model):
            parts.append(_doc(model) + "\n")
        for own in [m for m, link in linked.items() if link.whole_file and link.file == spec.anchor]:
            del linked[own]  # listed here, in full
        rows = list(_rows(model, "", spec, linked, (model,)))
        parts.append(table(["key", "type", "default", "meaning"], rows))
    return "\n".join(parts)


def _rows(
    model: type[BaseModel],
    prefix: str,
    spec: ConfigFile,
    linked: dict[type, Link],
    stack: tuple[type, ...],
    variant: str = "",
    first_anchor: str = "",
):
    """Rows of `model`'s keys under `prefix`; `variant` names which of a union's sections they are,
    `first_anchor` marks the first row. A section listed in full here is added to `linked`, so
    that later uses link to it."""
    notes = field_notes(model)
    for name, field in model.model_fields.items():
        key = prefix + name
        meaning = field.description or notes.get(name, "")
        nested = [m for m in _models_in(field.annotation) if m not in stack]
        links = [(m, linked[m]) for m in nested if m in linked]
        if links:
            union = len(nested) > 1
            see = ", ".join(
                (f"`{_variant(m)}` in " if union else "") + f"[{link.label}](#{link.anchor})"
                for m, link in links
            )
            meaning = (meaning + " " if meaning else "") + (f"Keys: {see}." if union else f"Keys: see {see}.")
        elif not meaning and len(nested) == 1:
            meaning = _doc(nested[0])
        elif not meaning and len(nested) > 1:
            meaning = "One of these sections: " + ", ".join(f"`{_variant(m)}`" for m in nested) + "."
        shown = code(key)
        expand = [m for m in nested if m not in linked]
        if len(expand) == 1 and len(nested) == 1:
            anchor = _anchor(spec, key)
            shown = f'<span id="{anchor}"></span>{shown}'
            linked_after = Link(spec.anchor, anchor, f"`{key}` of the {spec.title.lower()} config")
        else:
            linked_after = None
        yield (
            first_anchor + shown,
            code(type_name(field.annotation)),
            _default(field),
            cell(variant + meaning),
        )
        first_anchor = ""
        for child in expand:
            child_prefix = _child_prefix(key, field.annotation)
            if len(nested) > 1:  # one of a union's sections: its first row is where later uses link
                label = f"(with `{key}: {_variant(child)}`) "
                anchor = _anchor(spec, f"{key}-{_variant(child)}")
                child_link = Link(spec.anchor, anchor, f"`{key}` of the {spec.title.lower()} config")
                rows = _rows(
                    child, child_prefix, spec, linked, (*stack, child), label, f'<span id="{anchor}"></span>'
                )
                yield from rows
                linked.setdefault(child, child_link)
            else:
                yield from _rows(child, child_prefix, spec, linked, (*stack, child))
        if linked_after is not None and len(expand[0].model_fields) >= 3:
            linked.setdefault(expand[0], linked_after)


def _anchor(spec: ConfigFile, key: str) -> str:
    return f"{spec.anchor}-" + re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def _variant(model: type[BaseModel]) -> str:
    """What selects one section of a union: its `kind` (the discriminator the configs use), else its name."""
    kind = model.model_fields.get("kind")
    if kind is not None and typing.get_origin(kind.annotation) is Literal:
        return "{kind: " + str(typing.get_args(kind.annotation)[0]) + "}"
    return model.__name__


def _child_prefix(key: str, annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _child_prefix(key, args[0]) if len(args) == 1 else key + "."
    if origin in (list, tuple, set, frozenset):
        return key + "[]."
    if origin is dict:
        return key + ".<name>."
    return key + "."


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += [m for m in _models_in(arg) if m not in found]
    return found


def type_name(annotation: Any) -> str:
    """A type as a user reads it: `int`, `str | None`, `list[float]`, `"a" | "b"`."""
    if annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(arg) for arg in typing.get_args(annotation))
    if origin in (types.UnionType, typing.Union):
        return " | ".join(type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(type_name(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        factory = field.default_factory
        if getattr(factory, "__name__", "") == "<lambda>":
            return "computed (see meaning)"
        value = factory()
    else:
        value = field.default
    if value is PydanticUndefined:
        return "**required**"
    if isinstance(value, BaseModel):
        return "(section)"
    try:
        text = json.dumps(value, default=str)
    except TypeError:
        text = str(value)
    return code(text if len(text) <= 60 else text[:57] + "...")


def _doc(model: type) -> str:
    doc = model.__dict__.get("__doc__")
    return " ".join(inspect.cleandoc(doc).split()) if doc else ""


@cache
def field_notes(model: type) -> dict[str, str]:
    """Field name -> the docstring under it, else the comment on its line, for `model` and its bases."""
    notes: dict[str, str] = {}
    for klass in reversed(model.__mro__):
        if klass is BaseModel or not (isinstance(klass, type) and issubclass(klass, BaseModel)):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        comments = _comments(source)
        body = ast.parse(source).body[0].body
        for index, node in enumerate(body):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            after = body[index + 1] if index + 1 < len(body) else None
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                notes[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
            elif node.end_lineno in comments:
                notes[node.target.id] = comments[node.end_lineno]
    return notes


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment ending that line (type-checker pragmas left out)."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not token.string.startswith(("# type:", "# noqa")):
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found
