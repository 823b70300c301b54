"""`rollflow`'s command groups: each group's name and one-line help are written once (`COMMAND_GROUPS`),
so `rollflow --help` lists a group as the group itself does, and `--output-dir` turns into the config
key its option names."""

from __future__ import annotations

import argparse

import pytest

from rollflow.cli import COMMAND_GROUPS, build_parser
from rollflow.cli_util import add_command, config_overrides


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


@pytest.mark.parametrize("group", COMMAND_GROUPS)
def test_rollflow_help_lists_a_group_as_the_registered_group_does(group):
    """`rollflow --help` registers no group; `rollflow --help GROUP` (and `rollflow GROUP ...`)
    registers that one in full. Both list every group alike, with the help `COMMAND_GROUPS` gives."""
    listing = build_parser([]).format_help()
    registered = build_parser([group])
    assert registered.format_help() == listing
    listed = {choice.dest: choice.help for choice in _subcommands(registered)._choices_actions}
    assert listed == {name: help for name, (_, help) in COMMAND_GROUPS.items()}


@pytest.mark.parametrize("group", COMMAND_GROUPS)
def test_each_group_is_a_command_or_a_group_of_them_with_examples(group):
    parser = _subcommands(build_parser([group])).choices[group]
    assert parser.prog == f"rollflow {group}"
    assert parser.epilog and parser.epilog.startswith("examples:")
    inner = _subcommands(parser)
    if inner is None:  # one command, such as `rollflow train`
        assert callable(parser.get_default("handler")) and parser.description
    else:
        assert inner.required and inner.choices
        for name, command in inner.choices.items():
            assert callable(command.get_default("handler")), f"rollflow {group} {name} runs nothing"


def test_a_commands_help_is_its_handlers_docstring():
    """The first paragraph is the help its group lists, the next the description, and a last
    `example:` paragraph ends `--help`; each is one line, which argparse wraps."""

    def handler(args: argparse.Namespace, started_at: float) -> None:
        """the one-line help

        The description, written
        over two lines.

        example: rollflow group command
        --flag
        """

    group = argparse.ArgumentParser(prog="rollflow group")
    command = add_command(group, "command", handler, fast_exit=True)
    assert [choice.help for choice in _subcommands(group)._choices_actions] == ["the one-line help"]
    assert command.description == "The description, written over two lines."
    assert command.epilog == "example:\n  rollflow group command --flag"
    assert command.get_default("handler") is handler and command.get_default("fast_exit")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["sim", "serve", "--config", "c.yaml", "a=1", "--output-dir", "out"], ["a=1", "output.dir=out"]),
        (["sim", "replay", "--from-manager-log", "l", "--config", "c.yaml"], []),
        (["rl-sim", "run", "--config", "c.yaml", "--output-dir", "out"], ["output.dir=out"]),
        (
            ["router", "train", "--config", "c.yaml", "--output-dir", "out", "output_dir=x"],
            ["output_dir=x", "output_dir=out"],
        ),
        (["sim", "search", "--config", "c.yaml", "--output-dir", "out"], ["output_dir=out"]),
        (["sim", "config", "a=1"], ["a=1"]),  # no --output-dir to turn into a key
        (["demo", "run", "--config", "c.yaml", "--output-dir", "out", "a=1"], ["a=1"]),  # demo's own folder
    ],
)
def test_output_dir_overrides_the_key_its_option_names_and_wins(argv, expected):
    args = build_parser(argv).parse_args(argv)
    assert config_overrides(args) == expected
