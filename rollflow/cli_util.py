"""Small pieces every command group's CLI uses: one way to add a command, a config with its
overrides, a server's address and secret, a progress bar.

A command's `--help` is its handler's docstring (`add_command`), as in click and typer: what a
command does is written once, beside the code that does it."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a command's --help needs no pydantic
    from pydantic import BaseModel

Handler = Callable[[argparse.Namespace, float], None]
"""What a command runs: `handler(args, started_at)` (rollflow/cli.py calls it)."""


class HelpFormatter(argparse.HelpFormatter):
    """`--help` with descriptions wrapped to the terminal and examples (any text of several lines)
    kept as written, so each example stays one command line a user can copy."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def print_yaml(config: BaseModel) -> None:
    """Print a config with every default filled in, in the YAML users write."""
    import yaml

    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")


def add_command(
    group: argparse.ArgumentParser,
    name: str,
    handler: Handler,
    examples: str | None = None,
    **defaults: object,
) -> argparse.ArgumentParser:
    """The sub-command `name` of `group` (a top-level command rollflow/cli.py made), which runs
    `handler`; the caller adds its options. Its `--help` is the handler's docstring, as click and
    typer take it: the first paragraph is the one-line help `group --help` lists, the next the
    description, and a last paragraph `example: COMMAND LINE` ends it (or `examples`, the group's
    whole block). Each paragraph is folded into one line, which `--help` wraps to the terminal.
    `defaults` are set on the parsed arguments beside the handler (`fast_exit=True`, see
    rollflow/cli.py)."""
    help, *paragraphs = (_folded(text) for text in re.split(r"\n\s*\n", _docstring(handler)))
    if paragraphs and paragraphs[-1].startswith("example: "):
        examples = "example:\n  " + paragraphs.pop().removeprefix("example: ")
    return _add_parser(group, name, handler, help, " ".join(paragraphs) or None, examples, **defaults)


def set_command(group: argparse.ArgumentParser, handler: Handler) -> None:
    """Make `group` (a top-level command of its own, such as `rollflow train`) run `handler`, whose
    docstring is the description its `--help` shows (its one-line help is rollflow/cli.py's)."""
    group.description = _folded(_docstring(handler))
    group.set_defaults(handler=handler)


def _add_parser(
    group: argparse.ArgumentParser,
    name: str,
    handler: Handler,
    help: str,
    description: str | None,
    examples: str | None,
    **defaults: object,
) -> argparse.ArgumentParser:
    """`add_command` with its help given: the parser of `group name`, running `handler`. The first
    command added to a group makes it a group of sub-commands (one must be named)."""
    commands = next((a for a in group._actions if isinstance(a, argparse._SubParsersAction)), None)
    if commands is None:
        commands = group.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    parser = commands.add_parser(name, help=help, formatter_class=HelpFormatter)
    parser.description = description
    parser.epilog = examples
    parser.set_defaults(handler=handler, **defaults)
    return parser


def _docstring(handler: Handler) -> str:
    """The handler's docstring; none is an error here, where any `--help` of its group finds it,
    rather than a command listed with no help."""
    if not handler.__doc__:
        raise TypeError(f"{handler.__qualname__} has no docstring, which is its command's --help")
    return handler.__doc__.strip()


def _folded(text: str) -> str:
    """A docstring's paragraph as one line: `--help` wraps it to the terminal's width."""
    return " ".join(text.split())


def add_config_arguments(
    parser: argparse.ArgumentParser,
    config_help: str,
    overrides_example: str | None = None,
    output_key: str | None = None,
    required: bool = True,
) -> None:
    """`--config FILE` and the dotted `key=value` overrides laid over it; with `output_key`, also
    `--output-dir DIR`, which overrides that key of the config (`config_overrides` adds it)."""
    parser.add_argument("--config", required=required, help=config_help)
    if output_key is not None:
        parser.add_argument("--output-dir", help=f"output folder (overrides {output_key})")
        parser.set_defaults(output_key=output_key)
    example = f", e.g. {overrides_example}" if overrides_example else ""
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"dotted overrides{example}")


def config_overrides(args: argparse.Namespace) -> list[str]:
    """The dotted overrides of a command `add_config_arguments` set up, ending with `--output-dir DIR`
    as the key it overrides (so it wins over the same key given as an override)."""
    overrides = list(args.overrides)
    output_key = getattr(args, "output_key", None)
    if output_key is not None and args.output_dir:
        overrides.append(f"{output_key}={args.output_dir}")
    return overrides


def add_resume_argument(parser: argparse.ArgumentParser, auto: str, never: str) -> None:
    """`--resume auto|never`: whether a run carries on from what its output folder holds (`auto`, the
    default, says what it carries on from; `never`, what starting over does)."""
    parser.add_argument(
        "--resume", choices=("auto", "never"), default="auto", help=f"auto: {auto}; never: {never}"
    )


def add_show_config(
    group: argparse.ArgumentParser,
    help: str,
    load: Callable[[str | None, list[str]], BaseModel],
    config_help: str = "YAML config file (omit for the defaults)",
    name: str = "config",
    required: bool = False,
    example: str | None = None,
) -> None:
    """The group's sub-command `name` (`config`; `show` in the groups that run a whole config): the
    config `load(path, overrides)` validates, every default filled in, printed as YAML. `required`:
    the group's config has no defaults to print without a file."""
    show = _add_parser(
        group,
        name,
        lambda args, started_at: print_yaml(load(args.config, args.overrides)),
        help,
        None,
        example and f"example:\n  {example}",
    )
    add_config_arguments(show, config_help, required=required)


def add_listen_arguments(parser: argparse.ArgumentParser, port: int, in_config: bool = False) -> None:
    """`--host` and `--port` a server binds: 127.0.0.1 unless told otherwise (a server stays off the
    network until asked), and `port` unless given; 0 picks a free one. `in_config`: both are left
    None when not given, so the config's values (with the same defaults) stand."""
    parser.add_argument(
        "--host",
        default=None if in_config else "127.0.0.1",
        help="address to bind (default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None if in_config else port,
        help=f"port; 0 picks a free one (default {port})",
    )


def add_secret_argument(parser: argparse.ArgumentParser, flag: str, env: str, help: str) -> None:
    """`flag`, defaulting to `$env`: a secret set in the environment stays out of `ps`. An empty
    variable is no secret."""
    parser.add_argument(
        flag,
        default=os.environ.get(env) or None,
        help=f"{help} (default: ${env}, which keeps it out of `ps`)",
    )


@contextmanager
def profiling_progress(heading: str) -> Iterator[Callable[[int, int], None]]:
    """Print `heading` on stderr, then a bar of a profile's progress: yields the `(done, total)`
    callback its measuring loop calls after each point."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    console.print(heading)
    with Progress(
        TextColumn("profiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("profiling", total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)
