"""`rollflow launch up`: the manager, engines and trainer of a config, on this machine."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_command, add_config_arguments, add_show_config

EXAMPLES = """examples:
  rollflow engine init-model models/tiny   # the model examples/launch/local.yaml serves
  rollflow launch up --config examples/launch/local.yaml
  rollflow launch up --config examples/launch/local.yaml launch.autoscale.enabled=true launch.autoscale.max_engines=4
  rollflow launch show --config examples/launch/local.yaml
"""


def register(group: argparse.ArgumentParser) -> None:
    up = add_command(group, "up", _up, examples=EXAMPLES)
    add_config_arguments(up, "YAML file with a launch: section (see examples/launch/)", "launch.work_dir=out")

    add_show_config(
        group,
        "print the launch section with every default filled in",
        _load,
        "YAML file with a launch: section",
        name="show",
        required=True,
        example="rollflow launch show --config examples/launch/local.yaml",
    )


def _up(args: argparse.Namespace, started_at: float) -> None:
    """start everything in the config's launch section and supervise it

    Start the rollout manager, then every engine pool (each engine pulls the newest weights when
    its pool names a weights_url, and is registered with the manager), then the trainer command.
    Runs until the trainer exits or Ctrl-C, adding or removing engines after each reported step
    when autoscale is enabled; then stops every process it started. Everything binds 127.0.0.1.
    """
    import sys

    from rollflow.runtime.launch.config import load_launch_config
    from rollflow.runtime.launch.launcher import Launcher
    from rollflow.runtime.logs import setup_logging
    from rollflow.runtime.signals import stop_on_sigterm

    config = load_launch_config(args.config, args.overrides)
    setup_logging("text")
    stop_on_sigterm()  # the children are stopped on the way out
    with Launcher(config) as launch:
        print(f"manager on {launch.manager_url}; {len(launch.engines)} engines registered", flush=True)
        try:
            code = launch.run()
        except KeyboardInterrupt:
            code = 130
    sys.exit(code)


def _load(path: str, overrides: list[str]):
    from rollflow.runtime.launch.config import load_launch_config

    return load_launch_config(path, overrides)
