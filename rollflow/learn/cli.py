"""`rollflow router ...`: train, evaluate and compare a learned request router."""

from __future__ import annotations

import argparse

from rollflow.cli_util import (
    add_command,
    add_config_arguments,
    add_resume_argument,
    add_show_config,
    config_overrides,
)

EXAMPLES = """examples:
  rollflow router train    --config examples/router/heterogeneous.yaml
  rollflow router train    --config examples/router/homogeneous.yaml --resume never ppo.total_steps=20000
  rollflow router evaluate --config examples/router/heterogeneous.yaml      # the policy train wrote
  rollflow router compare  --config examples/router/heterogeneous.yaml --policy examples/router/heterogeneous.policy.npz
  rollflow router config   --config examples/router/heterogeneous.yaml preset=vidur_arc2
"""


def register(group: argparse.ArgumentParser) -> None:
    train = add_command(group, "train", _train)
    _common(train)
    add_resume_argument(train, "continue from output_dir/checkpoint.pt if present", "start over")

    evaluate = add_command(group, "evaluate", _evaluate)
    _common(evaluate)
    evaluate.add_argument("--policy", help="policy file (default: policy_file, else output_dir/policy.npz)")

    compare = add_command(group, "compare", _compare)
    _common(compare)
    compare.add_argument("--policy", help="policy file (default: policy_file, else output_dir/policy.npz)")

    add_show_config(
        group,
        "print a config with every default (and the preset) filled in",
        _load_config,
        "YAML config file",
    )


def _common(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(
        parser, "YAML config file (see examples/router/)", "ppo.total_steps=1000", "output_dir"
    )


def _load(args: argparse.Namespace):
    return _load_config(args.config, config_overrides(args))


def _load_config(path: str | None, overrides: list[str]):
    from rollflow.config import load_config
    from rollflow.learn.config import LearnConfig

    return load_config(LearnConfig, path, overrides)


def _train(args: argparse.Namespace, started_at: float) -> None:
    """demonstrations -> behaviour cloning -> PPO -> policy.npz

    Train a router in the serving simulator. Writes checkpoint.pt, metrics.csv, tensorboard/ and
    policy.npz to output_dir (or --output-dir).

    example: rollflow router train --config examples/router/heterogeneous.yaml ppo.total_steps=20000
    """
    from rollflow.learn.train import train

    train(_load(args), resume=args.resume)


def _evaluate(args: argparse.Namespace, started_at: float) -> None:
    """the learned router on the held-out seeds: latency, SLO attainment, decision time

    example: rollflow router evaluate --config examples/router/heterogeneous.yaml
    """
    from rich.console import Console

    from rollflow.learn.compare import policy_path
    from rollflow.learn.evaluate import TimedRouter, decision_latency_us, run_router, summarize_latencies
    from rollflow.policy.learned import load_learned_router

    config = _load(args)
    router = TimedRouter(load_learned_router(policy_path(config, args.policy)))
    scenario = config.scenario
    scores = summarize_latencies(
        config, run_router(config, router, scenario.eval_seeds, scenario.eval_requests)
    )
    latency = decision_latency_us(router)
    Console().print(
        f"learned on seeds {scenario.eval_seeds}: E2E p99 {scores['e2e_p99']:.2f} s, mean {scores['e2e_mean']:.2f} s; "
        f"TTFT p99 {scores['ttft_p99']:.2f} s; SLO attainment {100 * scores['slo_attainment']:.1f}%; "
        f"decision latency median {latency['median_us']:.1f} us, mean {latency['mean_us']:.1f} us, "
        f"p99 {latency['p99_us']:.1f} us"
    )


def _compare(args: argparse.Namespace, started_at: float) -> None:
    """every router on the same held-out workloads; prints, plots and writes compare.json

    example: rollflow router compare --config examples/router/homogeneous.yaml
    --policy examples/router/homogeneous.policy.npz --output-dir out/
    """
    from pathlib import Path

    from rich.console import Console

    from rollflow.learn.compare import compare, policy_path

    config = _load(args)
    compare(config, policy_path(config, args.policy), Path(config.output_dir), Console())
