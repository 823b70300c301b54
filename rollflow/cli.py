"""The `rollflow` command.

Each command group lives beside the code it drives (`rollflow/sim/cli.py`, ...) and adds
itself to the parser through a `register(commands)` function listed in `COMMAND_GROUPS`;
imports of heavy modules happen inside the handlers, so `rollflow --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from rollflow import __version__

COMMAND_GROUPS = (
    "rollflow.sim.cli",
    "rollflow.sim.rl.cli",
    "rollflow.perf.profile.cli",
    "rollflow.learn.cli",
    "rollflow.runtime.engines.cli",
    "rollflow.runtime.manager.cli",
    "rollflow.runtime.weights.cli",
    "rollflow.runtime.trainer.cli",
    "rollflow.runtime.launch.cli",
    "rollflow.runtime.demo.cli",
)

EXAMPLES = """examples:
  rollflow sim serve --config examples/sim/demo.yaml
  rollflow sim from-vidur --output-dir out/ -- --replica_scheduler_config_type vllm
  rollflow rl-sim compare --config examples/rl/rlinf_dynamic.yaml --output-dir out/rlinf
  rollflow engine init-model outputs/tiny && rollflow engine serve --model outputs/tiny --port 30001
  rollflow manager serve --config examples/manager/local.yaml
  rollflow weights serve --dir outputs/weights
  rollflow train --config examples/train/grpo_tiny.yaml
  rollflow router compare --config examples/router/heterogeneous.yaml
Run `rollflow COMMAND --help` for each command's options and examples.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollflow",
        description="Scheduling for LLM RL post-training: simulate serving clusters and RL steps, "
        "learn routers, and run a rollout manager over engines that come and go.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rollflow {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_GROUPS:
        importlib.import_module(module).register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    started_at = time.perf_counter()
    args = build_parser().parse_args(argv)
    from rollflow.errors import UserError

    try:
        args.handler(args, started_at)
    except UserError as exc:
        print(f"rollflow: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rollflow: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
