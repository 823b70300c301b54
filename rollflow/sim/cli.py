"""`rollflow sim ...`: simulate an LLM inference cluster."""

from __future__ import annotations

import argparse
import os

from rollflow.cli_util import add_command, add_config_arguments, add_show_config, config_overrides, print_yaml

EXAMPLES = """examples:
  rollflow sim serve --config examples/sim/demo.yaml
  rollflow sim serve --config examples/sim/vidur_sarathi_4r.yaml cluster.replicas=8 scheduler.chunk_size=1024
  rollflow sim from-vidur --output-dir out/ -- --replica_scheduler_config_type vllm --cluster_config_num_replicas 2
  rollflow sim serve --config examples/sim/demo.yaml --no-plots
  rollflow sim config --config examples/sim/demo.yaml workload.intervals.qps=20
  rollflow sim replay --from-manager-log requests.jsonl --config sim.yaml --output-dir out/replay
  rollflow sim search --config examples/search/llama2_7b_a100.yaml --output-dir outputs/search/7b
"""

# numpy starts OpenBLAS's thread pool when it is imported; a simulation does no BLAS work that
# threads would speed up, and the idle pool cost about 0.1 CPU s of every run here. Set before
# numpy is imported (only this group's module is imported first); a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def register(group: argparse.ArgumentParser) -> None:
    serve = add_command(group, "serve", _serve, fast_exit=True)
    add_config_arguments(serve, "YAML config file (see examples/sim/)", "cluster.replicas=4", "output.dir")
    _add_no_plots(serve)

    vidur = add_command(group, "from-vidur", _from_vidur, fast_exit=True)
    vidur.add_argument(
        "--output-dir", help="output folder (default: --metrics_config_output_dir or simulator_output)"
    )
    _add_no_plots(vidur)
    vidur.add_argument(
        "--print-config", action="store_true", help="print the translated config as YAML and exit"
    )
    vidur.add_argument("vidur_flags", nargs=argparse.REMAINDER, help="Vidur flags, after --")

    replay = add_command(group, "replay", _replay)
    replay.add_argument("--from-manager-log", required=True, metavar="FILE", help="the manager's request log")
    add_config_arguments(replay, "sim YAML config describing the engines", output_key="output.dir")

    add_show_config(group, "print a config with every default filled in, as YAML", _load_sim_config)


def _add_no_plots(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="skip plots/ (sets output.plots=false; saves drawing two PNGs, for searches and loops)",
    )


def _load_sim_config(path: str | None, overrides: list[str]):
    from rollflow.config import load_config
    from rollflow.sim.config import SimConfig

    return load_config(SimConfig, path, overrides)


def _serve(args: argparse.Namespace, started_at: float) -> None:
    """run a serving simulation from a YAML config

    Run a serving simulation. Config keys can be overridden as dotted key=value pairs; outputs
    (summary.json, requests.csv, chrome_trace.json, plots/) go to --output-dir or output.dir.
    """
    from rollflow.sim.runner import run_simulation

    overrides = config_overrides(args)
    if args.no_plots:
        overrides.append("output.plots=false")
    config = _load_sim_config(args.config, overrides)
    run_simulation(config, started_at=started_at)


def _from_vidur(args: argparse.Namespace, started_at: float) -> None:
    """run the simulation a `python -m vidur.main` command line describes

    Translate Vidur's command-line flags (put them after --) into a rollflow config and run it.
    Profile-table paths keep Vidur's {DEVICE}/{MODEL}/{NETWORK_DEVICE} placeholders and defaults
    (./data/profiling/... under the current directory). Unsupported flags are errors.
    """
    from rollflow.sim.vidur_flags import vidur_flags_to_config

    flags = args.vidur_flags[1:] if args.vidur_flags[:1] == ["--"] else args.vidur_flags
    config = vidur_flags_to_config(flags, args.output_dir)
    if args.no_plots:
        output = config.output.model_copy(update={"plots": False})
        config = config.model_copy(update={"output": output})
    if args.print_config:
        print_yaml(config)
        return
    from rollflow.sim.runner import run_simulation

    run_simulation(config, started_at=started_at)


def _replay(args: argparse.Namespace, started_at: float) -> None:
    """replay a manager's request log in the simulator; print simulated against recorded latencies

    Replay the finished samples of a manager's request log (its `request_log:` file) at their
    recorded arrival times on the cluster, scheduler and profile tables of --config (its workload
    is ignored), and print simulated against recorded TTFT, TPOT and E2E at p50 and p90.
    --output-dir (or output.dir) gets replay.json.
    """
    from rollflow.sim.replay import format_report, replay_manager_log, write_report

    config = _load_sim_config(args.config, config_overrides(args))
    report = replay_manager_log(config, args.from_manager_log)
    print(format_report(report))
    print(f"wrote {write_report(config.output.dir, report)}")
