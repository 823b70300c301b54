"""Small pieces every command group's CLI uses."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a command's --help needs no pydantic
    from pydantic import BaseModel


def print_yaml(config: BaseModel) -> None:
    """Print a config with every default filled in, in the YAML users write."""
    import yaml

    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")


def add_command_group(commands: argparse._SubParsersAction, name: str, help: str, examples: str):
    """A top-level command whose sub-commands the caller adds; `--help` ends with its examples."""
    group = commands.add_parser(
        name, help=help, epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return group.add_subparsers(dest=f"{name}_command", required=True, metavar="SUBCOMMAND")


def add_config_arguments(
    parser: argparse.ArgumentParser, examples: str, output_key: str, overrides_example: str
) -> None:
    """What a command that runs a YAML config takes: `--config FILE` (required), `--output-dir DIR`
    (overriding the config's `output_key`) and dotted `key=value` overrides."""
    parser.add_argument("--config", required=True, help=f"YAML config file (see {examples})")
    parser.add_argument("--output-dir", help=f"output folder (overrides {output_key})")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help=f"dotted overrides, e.g. {overrides_example}"
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
    show = commands.add_parser(name, help=help, epilog=f"example: {example}" if example else None)
    show.add_argument("--config", required=required, help=config_help)
    show.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    show.set_defaults(handler=lambda args, started_at: print_yaml(load(args.config, args.overrides)))
