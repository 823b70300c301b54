"""`rollflow demo`: the end-to-end run that `make demo` starts."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_command, add_config_arguments, add_show_config

EXAMPLES = """examples:
  rollflow demo run --config examples/demo/preemption.yaml --output-dir outputs/demo
  rollflow demo run --config examples/demo/dynamic.yaml --output-dir outputs/dynamic
  rollflow demo run --config examples/demo/preemption.yaml --output-dir outputs/demo train.steps=10 demo.preemption.step=3
  rollflow demo show --config examples/demo/preemption.yaml
"""

CONFIG_HELP = "YAML with launch:, train: and demo: sections"


def register(group: argparse.ArgumentParser) -> None:
    run = add_command(group, "run", _run, examples=EXAMPLES)
    add_config_arguments(run, CONFIG_HELP, "train.steps=10")
    run.add_argument(
        "--output-dir",
        default="outputs/demo",
        help="summary.json and timeline.png; the launch's logs go to OUTPUT_DIR/launch and the trainer's "
        "files to OUTPUT_DIR/train (default: outputs/demo)",
    )

    add_show_config(
        group,
        "print the config with every default filled in",
        _load,
        CONFIG_HELP,
        name="show",
        required=True,
        example="rollflow demo show --config examples/demo/preemption.yaml",
    )


def _run(args: argparse.Namespace, started_at: float) -> None:
    """launch manager, weight server, engines and trainer; preempt a spot engine mid-rollout

    Start the manager, a weight server and the engine pools of the config's launch section (on
    127.0.0.1), then train with the config's train section. During the rollout of
    demo.preemption.step one engine of the preempted pool (default: the first spot pool) is killed
    with SIGKILL while it streams half-done samples; the manager resumes them elsewhere from their
    tokens, and a new engine pulls the newest weights and joins. Ends with a summary table,
    summary.json and timeline.png in --output-dir. A config with RLinf's cluster: section
    (examples/demo/dynamic.yaml) runs the dynamic-scheduling demo instead: devices move between
    actor and rollout within each step (summary.json and gantt.png).
    """
    import signal
    import sys
    from pathlib import Path

    from rollflow.runtime.demo.config import load_demo_config
    from rollflow.runtime.demo.run import print_summary, run_demo
    from rollflow.runtime.logs import setup_logging

    config = load_demo_config(args.config, args.overrides, args.output_dir)
    setup_logging("text")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the children on SIGTERM too
    output_dir = Path(args.output_dir)
    if config.cluster is not None:
        from rollflow.runtime.demo.dynamic import check_dynamic, print_dynamic, run_dynamic_demo

        check_dynamic(config)
        print_dynamic(run_dynamic_demo(config, output_dir))
        return
    summary = run_demo(config, output_dir, tty=sys.stderr.isatty())
    print_summary(summary, output_dir)


def _load(path: str, overrides: list[str]):
    from rollflow.runtime.demo.config import load_demo_config

    return load_demo_config(path, overrides)
