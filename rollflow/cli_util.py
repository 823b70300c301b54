"""Small pieces every command group's CLI uses."""

from __future__ import annotations

import argparse
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
