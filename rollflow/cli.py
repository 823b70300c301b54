"""The `rollflow` command.

Each command group's name and one-line help are `COMMAND_GROUPS`'s, the only place they are
written: `build_parser` makes the group's parser from them, ending its `--help` with the `EXAMPLES`
of the module that lives beside the code the group drives (`rollflow/sim/cli.py`, ...), and hands
it to that module's `register(group)`, which adds its sub-commands (`cli_util.add_command`, whose
`--help` is the handler's docstring) or, for a group that is one command such as `rollflow train`,
its options. Only the group a command line names is imported, and handlers import heavy modules
themselves, so `rollflow --help` and `rollflow sim ...` never load torch, whatever the other
groups import.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import sys
import time

from rollflow import __version__
from rollflow.cli_util import HelpFormatter

# command -> (module with its `register`, the one-line help `rollflow --help` lists), here rather
# than in the module so that `rollflow --help` imports no group
COMMAND_GROUPS: dict[str, tuple[str, str]] = {
    "sim": ("rollflow.sim.cli", "simulate an LLM inference cluster"),
    "rl-sim": (
        "rollflow.sim.rl.cli",
        "simulate RL training steps (rollout, inference, training, weight sync) on a GPU cluster",
    ),
    "profile": (
        "rollflow.perf.profile.cli",
        "measure a model's operators, or a running engine; write Vidur-format tables",
    ),
    "router": (
        "rollflow.learn.cli",
        "learn a request router with PPO in the simulator, and compare it with the heuristics",
    ),
    "engine": ("rollflow.runtime.engines.cli", "make a tiny model; serve it with the built-in engine"),
    "manager": (
        "rollflow.runtime.manager.cli",
        "run the rollout manager between a trainer and rollout engines",
    ),
    "weights": ("rollflow.runtime.weights.cli", "serve, publish and pull versioned model weights"),
    "train": ("rollflow.runtime.trainer.cli", "train a policy with GRPO or PPO on rollouts from the manager"),
    "launch": ("rollflow.runtime.launch.cli", "start the manager, engines and trainer of a config"),
    "demo": (
        "rollflow.runtime.demo.cli",
        "RL training end to end: through a spot preemption, or with devices moving between components",
    ),
}

# commands that join a group another module registers: group -> "module:function" of each, called
# with the group's parser (`rollflow sim search` is plan/'s, which builds on sim/; `rollflow
# profile engine` the engine profiler's, a client of engines, which perf/ sits below)
GROUP_COMMANDS: dict[str, tuple[str, ...]] = {
    "sim": ("rollflow.plan.cli:add_serve_search",),
    "rl-sim": ("rollflow.plan.cli:add_rl_search",),
    "profile": ("rollflow.runtime.engines.profiler.cli:add_profile_engine",),
}

EXAMPLES = """examples:
  rollflow sim serve --config examples/sim/demo.yaml
  rollflow sim from-vidur --output-dir out/ -- --replica_scheduler_config_type vllm
  rollflow rl-sim compare --config examples/rl/rlinf_dynamic.yaml --output-dir out/rlinf
  rollflow engine init-model outputs/tiny && rollflow engine serve --model outputs/tiny --port 30001
  rollflow manager serve --config examples/manager/local.yaml
  rollflow weights serve --dir outputs/weights
  rollflow train --config examples/train/grpo_tiny.yaml
  rollflow router compare --config examples/router/heterogeneous.yaml --policy examples/router/heterogeneous.policy.npz
Run `rollflow COMMAND --help` for each command's options and examples.
"""


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser for `argv`: the group it names is registered in full, the others by name and help."""
    parser = argparse.ArgumentParser(
        prog="rollflow",
        description="Scheduling for LLM RL post-training: simulate serving clusters and RL steps, "
        "learn routers, and run a rollout manager over engines that come and go.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rollflow {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = _named_command(argv)
    for name, (module, help) in COMMAND_GROUPS.items():
        if name != named:
            commands.add_parser(name, help=help, add_help=False)
            continue
        group_module = importlib.import_module(module)
        group = commands.add_parser(
            name, help=help, epilog=group_module.EXAMPLES, formatter_class=HelpFormatter
        )
        group_module.register(group)
        for entry in GROUP_COMMANDS.get(name, ()):
            extension, function = entry.split(":")
            getattr(importlib.import_module(extension), function)(group)
    return parser


def _named_command(argv: list[str]) -> str | None:
    """The command group `argv` names: its first word that is not an option."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMAND_GROUPS else None
    return None


def main(argv: list[str] | None = None, exit_when_done: bool = False) -> int:
    """Run the command `argv` names; its exit code.

    `exit_when_done` (the console entry point) ends the process as soon as a command that sets
    `fast_exit` succeeds: the simulators, whose files are all written and closed when they
    return. The interpreter's teardown would otherwise free every request and batch record one by
    one, about 0.15 s of a one-second simulation. Other commands exit normally (their atexit
    hooks, child processes and temporary folders need it)."""
    started_at = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    from rollflow.errors import UserError

    try:
        args.handler(args, started_at)
    except UserError as exc:
        print(f"rollflow: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rollflow: interrupted", file=sys.stderr)
        return 130
    if exit_when_done and getattr(args, "fast_exit", False):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def run() -> None:
    """The `rollflow` console script. `kill -USR1 PID` prints every thread's stack to its stderr:
    where a server that stopped answering is stuck, with no debugger on the machine."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.exit(main(exit_when_done=True))


if __name__ == "__main__":
    run()
