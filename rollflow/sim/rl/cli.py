"""`rollflow rl-sim ...`: simulate RL training steps and compare GPU scheduling policies."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_command, add_config_arguments, add_show_config, config_overrides

EXAMPLES = """examples:
  rollflow rl-sim run --config examples/rl/rlinf_dynamic.yaml --output-dir out/rl
  rollflow rl-sim run --config examples/rl/rlinf_dynamic.yaml scheduling.kind=static workload.num_prompts=128
  rollflow rl-sim run --config examples/rl/rlinf_dynamic.yaml scheduling.kind=static off_policy=1
  rollflow rl-sim compare --config examples/rl/rlboost_spot.yaml --output-dir out/spot
  rollflow rl-sim config --config examples/rl/rlboost_spot.yaml spot.on_preemption=restart
  rollflow rl-sim search --config examples/search/rl_budget.yaml --output-dir outputs/search/rl
"""


def register(group: argparse.ArgumentParser) -> None:
    _common(add_command(group, "run", _run, examples=EXAMPLES))
    _common(add_command(group, "compare", _compare, examples=EXAMPLES))
    add_show_config(group, "print a config with every default filled in, as YAML", _load)


def _common(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "YAML config file (see examples/rl/)", "num_gpus=64 steps=2", "output.dir")
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="skip gantt.png and compare.png (sets output.gantt=false), for searches and loops",
    )


def _load(path: str | None, overrides: list[str]):
    from rollflow.config import load_config
    from rollflow.sim.rl.config import RLSimConfig

    return load_config(RLSimConfig, path, overrides)


def _run(args: argparse.Namespace, started_at: float) -> None:
    """simulate the steps a YAML config describes

    Simulate RL training steps. Config keys can be overridden as dotted key=value pairs;
    summary.json, gantt.png and chrome_trace.json go to --output-dir or output.dir.
    """
    from rollflow.sim.rl.runner import run_rl

    run_rl(_load(args.config, _with_plots(args, config_overrides(args))))


def _compare(args: argparse.Namespace, started_at: float) -> None:
    """run every policy of the config's `compare` list on its workload; print, plot and save the table

    Run each variant under `compare:` (a name plus dotted overrides) on the config's workload and
    write compare.json (per policy: step_time_s, throughput_tokens_per_s, gpu_utilization,
    cost_usd_per_mtok, regenerated_tokens), compare.png, and each variant's outputs under
    DIR/<name>/.
    """
    from rollflow.sim.rl.compare import run_compare

    # --output-dir goes to run_compare, which gives each variant a folder of its own inside it
    run_compare(args.config, _with_plots(args, args.overrides), args.output_dir, plots=not args.no_plots)


def _with_plots(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    return [*overrides, "output.gantt=false"] if args.no_plots else overrides
