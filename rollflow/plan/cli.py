"""Handlers of the search subcommands, which rollflow/cli.py (`GROUP_COMMANDS`) adds to
`rollflow sim` and `rollflow rl-sim`."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_command, add_config_arguments, add_resume_argument, config_overrides


def add_serve_search(sim: argparse.ArgumentParser) -> None:
    """`rollflow sim search`."""
    search = add_command(sim, "search", _serve_search)
    _add_search_arguments(search)
    add_resume_argument(search, "reuse cached configurations", "search all again")


def _serve_search(args: argparse.Namespace, started_at: float) -> None:
    """find each configuration's max QPS under SLOs, capacity per dollar and the Pareto fronts

    Capacity search: for every configuration of the config's `space`, the highest QPS meeting
    every SLO (bisection over `sim serve` runs). Writes results.csv, results.json,
    pareto_<metric>.png and best.yaml into --output-dir; finished configurations are cached there,
    so a rerun resumes.
    """
    from rollflow.config import load_config
    from rollflow.plan.serve_config import ServeSearchConfig
    from rollflow.plan.serve_search import run_search

    run_search(load_config(ServeSearchConfig, args.config, _overrides(args)), resume=args.resume)


def add_rl_search(rl_sim: argparse.ArgumentParser) -> None:
    """`rollflow rl-sim search`."""
    _add_search_arguments(add_command(rl_sim, "search", _rl_search))


def _rl_search(args: argparse.Namespace, started_at: float) -> None:
    """simulate every RL plan of a space; throughput, GPU utilisation and $ per 1M tokens per plan

    RL plan search: placements (collocated; disaggregated splits with or without pipelining),
    scheduling policies, preemptible instances and local budgets, within a budget. Writes
    results.csv, results.json, pareto_throughput_cost.png and best.yaml into --output-dir.
    """
    from rollflow.config import load_config
    from rollflow.plan.rl_config import RLSearchConfig
    from rollflow.plan.rl_search import run_rl_search

    run_rl_search(load_config(RLSearchConfig, args.config, _overrides(args)))


def _add_search_arguments(search: argparse.ArgumentParser) -> None:
    """What both searches take: a config with its overrides, `--output-dir` and `--backend`."""
    add_config_arguments(search, "YAML config file (see examples/search/)", "workers=1", "output_dir")
    search.add_argument("--backend", choices=("local", "ray"), help="overrides backend")


def _overrides(args: argparse.Namespace) -> list[str]:
    """A search's dotted overrides, with --output-dir and --backend as the keys they stand for."""
    overrides = config_overrides(args)
    if args.backend:
        overrides.append(f"backend={args.backend}")
    return overrides
