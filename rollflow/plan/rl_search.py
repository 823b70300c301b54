"""`rollflow rl-sim search`: simulate every RL plan, report throughput against cost, pick the best."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from rollflow.config import ConfigError, validate_config
from rollflow.console_table import print_table
from rollflow.plan.backends import run_with_progress
from rollflow.plan.pareto import plot_front
from rollflow.plan.rl_config import RLSearchConfig
from rollflow.plan.rl_export import live_cluster_section
from rollflow.plan.rl_plans import expand_plans, plan_config, plan_label

METRICS = (
    "step_time_s",
    "throughput_tokens_per_s",
    "gpu_utilization",
    "cost_usd_per_mtok",
    "manager_bound_s_per_step",
)


def evaluate_plan(job: dict[str, Any]) -> dict[str, Any]:
    """One plan's `rollflow rl-sim run` (validated config in, summary out) as a results row."""
    from rollflow.sim.rl.config import RLSimConfig
    from rollflow.sim.rl.runner import run_rl

    started = time.perf_counter()
    plan, raw = job["plan"], job["config"]
    row: dict[str, Any] = {"index": job["index"], **plan, "usd_per_hour": None, "skipped": None}
    if (
        plan["placement"] == "disaggregated"
        and plan["actor_gpus"] + plan["inference_gpus"] >= plan["num_gpus"]
    ):
        reason = (
            f"actor {plan['actor_gpus']} + inference {plan['inference_gpus']} GPUs leave no rollout GPU "
            f"of {plan['num_gpus']}"
        )
        return row | dict.fromkeys(METRICS) | {"skipped": reason, "seconds": 0.0}
    try:
        config = validate_config(RLSimConfig, raw)
    except ConfigError as exc:
        return row | dict.fromkeys(METRICS) | {"skipped": _reason(exc), "seconds": 0.0}
    cost = config.cost
    usd_per_hour = (
        config.num_gpus * cost.on_demand_usd_per_gpu_hour
        + config.spot.instances * config.rollout.tensor_parallel * cost.spot_usd_per_gpu_hour
        + config.manager.processes * cost.cpu_usd_per_core_hour
    )
    row["usd_per_hour"] = usd_per_hour
    if job["budget_usd_per_hour"] is not None and usd_per_hour > job["budget_usd_per_hour"]:
        reason = f"costs ${usd_per_hour:.2f}/hour (all instances up), over the ${job['budget_usd_per_hour']:.2f} budget"
        return row | dict.fromkeys(METRICS) | {"skipped": reason, "seconds": 0.0}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        summary = run_rl(config, console=Console(file=io.StringIO()), print_tables=False)
    return row | {m: summary[m] for m in METRICS} | {"seconds": round(time.perf_counter() - started, 3)}


def _reason(exc: ConfigError) -> str:
    """The validation message without its prefixes (the plan's own knobs name the config)."""
    text = str(exc).removeprefix("config error: ")
    return text.removeprefix(": ").removeprefix("Value error, ")


def run_rl_search(config: RLSearchConfig, console: Console | None = None) -> list[dict]:
    started = time.perf_counter()
    console = console or Console(stderr=True)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    plans = expand_plans(config.space)
    if not plans:
        raise ConfigError("config error: space: no plan to search (every combination is excluded)")
    if any(plan["manager_processes"] for plan in plans):  # a missing results file fails once, here
        from rollflow.sim.rl.config import ManagerConfig
        from rollflow.sim.rl.manager import cpu_us_per_token

        cpu_us_per_token(validate_config(ManagerConfig, config.simulation.get("manager") or {}))
    jobs = []
    for index, plan in enumerate(plans):
        raw = plan_config(config.simulation, plan)
        raw["output"] = {
            **raw.get("output", {}),
            "dir": str((out / "plans" / f"plan_{index}").resolve()),
            "gantt": False,
            "chrome_trace": False,
            "progress": False,
        }
        jobs.append(
            {"index": index, "plan": plan, "config": raw, "budget_usd_per_hour": config.budget.usd_per_hour}
        )
    rows = list(run_with_progress(evaluate_plan, jobs, config.backend, config.workers, console, "plans"))
    rows.sort(key=lambda r: r["index"])
    _write(out, rows, config, jobs, console)
    console.print(f"searched {len(rows)} plans in {time.perf_counter() - started:.1f} s")
    return rows


def _write(out: Path, rows: list[dict], config: RLSearchConfig, jobs: list[dict], console: Console) -> None:
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    ran = [r for r in rows if not r["skipped"]]
    written = [out / "results.json", out / "results.csv"]
    table = Table(title="RL plans")
    manager = any(r["manager_processes"] for r in ran)  # a column of its own when the search tries it
    for column in ("plan", "step s", "tokens/s", "GPU util", "$/1M tok", "$/hour"):
        table.add_column(column)
    if manager:
        table.add_column("manager-bound s")
    for row in ran:
        cells = [
            plan_label(row),
            f"{row['step_time_s']:.1f}",
            f"{row['throughput_tokens_per_s']:.0f}",
            f"{100 * row['gpu_utilization']:.1f}%",
            f"{row['cost_usd_per_mtok']:.3f}",
            f"{row['usd_per_hour']:.2f}",
        ]
        table.add_row(*cells, *([f"{row['manager_bound_s_per_step']:.1f}"] if manager else []))
    print_table(table, console)
    for row in rows:
        if row["skipped"]:
            console.print(f"skipped {plan_label(row)}: {row['skipped']}")
    if not ran:
        console.print("no plan could run")
        return
    path = out / "pareto_throughput_cost.png"
    plot_front(
        path,
        [r["throughput_tokens_per_s"] for r in ran],
        [r["cost_usd_per_mtok"] for r in ran],
        "trained tokens/s",
        "$ per 1M trained tokens",
        "RL plans: throughput vs cost",
    )
    written.append(path)
    sign = 1 if config.objective == "throughput_tokens_per_s" else -1
    best = max(ran, key=lambda r: sign * r[config.objective])
    raw = {k: v for k, v in jobs[best["index"]]["config"].items() if k != "output"}
    raw["output"] = {"dir": str(out / "best")}
    best_path = out / "best.yaml"
    best_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    written.append(best_path)
    cluster = live_cluster_section(raw)
    if cluster is not None:
        cluster_path = out / "best_cluster.yaml"
        cluster_path.write_text(yaml.safe_dump({"cluster": cluster}, sort_keys=False))
        written.append(cluster_path)
    console.print(
        f"best ({config.objective}): {plan_label(best)}: step {best['step_time_s']:.1f} s, "
        f"{best['throughput_tokens_per_s']:.0f} tokens/s, ${best['cost_usd_per_mtok']:.3f}/1M tokens"
    )
    console.print(f"reproduce: .venv/bin/rollflow rl-sim run --config {best_path}")
    if cluster is not None:
        console.print(f"run it live: add {cluster_path}'s cluster: section to your `rollflow train` config")
    console.print(f"wrote {', '.join(str(p) for p in written)}")
