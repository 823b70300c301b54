"""Small pieces every command group's CLI uses: one way to add a command, a config with its
overrides, a server's address and secret, a progress bar."""

from __future__ import annotations

import argparse
import os
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


def add_subcommands(group: argparse.ArgumentParser, examples: str) -> argparse._SubParsersAction:
    """Make `group` (a top-level command rollflow/cli.py made, with its name and one-line help) a group
    of sub-commands, which the caller adds to what this returns; `--help` ends with its `examples`."""
    group.epilog = examples
    return group.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")


def add_command(
    commands: argparse._SubParsersAction,
    name: str,
    handler: Handler,
    help: str,
    description: str | None = None,
    examples: str | None = None,
    **defaults: object,
) -> argparse.ArgumentParser:
    """The command `name`, which runs `handler`; the caller adds its options (see `set_command`)."""
    parser = commands.add_parser(name, help=help, formatter_class=HelpFormatter)
    set_command(parser, handler, description, examples, **defaults)
    return parser


def set_command(
    parser: argparse.ArgumentParser,
    handler: Handler,
    description: str | None = None,
    examples: str | None = None,
    **defaults: object,
) -> None:
    """Make `parser` (a sub-command, or a top-level command of its own such as `rollflow train`) run
    `handler`. `--help` shows `description` and ends with `examples`: the group's block, or one command
    line. `defaults` are set on the parsed arguments beside the handler (`fast_exit=True`, see
    rollflow/cli.py)."""
    if examples is not None and "\n" not in examples:
        examples = f"example:\n  {examples}"
    parser.description = description
    parser.epilog = examples
    parser.set_defaults(handler=handler, **defaults)


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
    commands: argparse._SubParsersAction,
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
    show = add_command(
        commands,
        name,
        lambda args, started_at: print_yaml(load(args.config, args.overrides)),
        help=help,
        examples=example,
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
