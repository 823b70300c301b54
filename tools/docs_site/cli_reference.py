"""`reference/cli.md`: every command, sub-command and flag, read from the CLI's own argparse parser.

Each group registers itself with `rollflow.cli.build_parser([group])`, as when a user runs it, so the
page lists exactly what `rollflow GROUP ... --help` accepts.
"""

from __future__ import annotations

import argparse

from rollflow.cli import COMMAND_GROUPS, build_parser
from tools.docs_site.markdown import cell, code, table


def page() -> str:
    parts = [
        "# CLI reference\n",
        "Generated from `rollflow`'s own argument parser at build time: every command and flag "
        "`rollflow COMMAND --help` accepts. Config keys that commands take as `key=value` overrides "
        "are in the [config reference](config.md).\n",
        table(
            ["command", "what it does"],
            [
                (f"[`rollflow {name}`](#rollflow-{name})", cell(help))
                for name, (_, help) in COMMAND_GROUPS.items()
            ],
        ),
    ]
    for name in COMMAND_GROUPS:
        group = _subcommands(build_parser([name]))[name]
        parts.append(_command(f"rollflow {name}", group, level=2))
    return "\n".join(parts)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command(prog: str, parser: argparse.ArgumentParser, level: int) -> str:
    anchor = prog.replace(" ", "-")
    parts = [f"{'#' * level} `{prog}` {{#{anchor}}}\n"]
    if parser.description:
        parts.append(parser.description.strip() + "\n")
    usage = parser.format_usage().removeprefix("usage: ").strip()
    parts.append(f"```text\n{' '.join(usage.split())}\n```\n")
    rows = [_flag_row(parser, action) for action in parser._actions if _documented(action)]
    if rows:
        parts.append(table(["argument", "default", "meaning"], rows))
    children = _subcommands(parser)
    if children:
        parts.append(
            table(
                ["sub-command", "what it does"],
                [(f"[`{name}`](#{anchor}-{name})", cell(_help_of(parser, name))) for name in children],
            )
        )
    if parser.epilog:
        parts.append(f"```text\n{parser.epilog.strip()}\n```\n")
    for name, child in children.items():
        parts.append(_command(f"{prog} {name}", child, min(level + 1, 4)))
    return "\n".join(parts)


def _documented(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS and not isinstance(
        action, argparse._SubParsersAction | argparse._HelpAction
    )


def _flag_row(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[str, str, str]:
    if action.option_strings:
        metavar = "" if action.nargs == 0 else " " + _metavar(action)
        name = ", ".join(action.option_strings) + metavar
    else:
        name = _metavar(action)
    default = action.default
    shown = "" if default in (None, argparse.SUPPRESS, False, []) or action.nargs == 0 else code(default)
    meaning = parser._get_formatter()._expand_help(action) if action.help else ""
    if action.choices and not isinstance(action.choices, dict):
        meaning += " (one of: " + ", ".join(str(choice) for choice in action.choices) + ")"
    if action.required and (action.option_strings or action.nargs not in ("*", "?", argparse.REMAINDER)):
        meaning += " **(required)**"
    return code(name), shown, cell(meaning)


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices and not action.option_strings:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""
