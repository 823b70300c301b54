"""Outputs of an RL run: summary.json, a Gantt chart of every GPU, a chrome trace, and printed tables.

DIR/summary.json       step time, tokens/s, GPU utilization, idle GPU-seconds, cost; per step a
                       breakdown per component (window in the step, GPU-seconds)
DIR/gantt.png          which GPU did what when (light: a rollout instance holds the GPU, idle)
DIR/chrome_trace.json  one track per GPU group; open in https://ui.perfetto.dev
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rollflow.console_table import print_table
from rollflow.gantt import Bar, draw_gantt
from rollflow.phases import write_chrome_trace as write_phase_trace
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.trace import StepResult


def write_run(out_dir: Path, config: RLSimConfig, steps: list[StepResult], summary: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if config.output.gantt:
        written.append(plot_gantt(out_dir / "gantt.png", config, steps))
    if config.output.chrome_trace:
        written.append(write_chrome_trace(out_dir / "chrome_trace.json", steps))
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    written.insert(0, path)
    return written


def plot_gantt(path: Path, config: RLSimConfig, steps: list[StepResult]) -> Path:
    bars = [
        Bar(gpu_start, gpus, start, end, None)
        for step in steps
        for gpu_start, gpus, _, start, end in step.instance_windows
    ]
    bars += [
        Bar(span.gpu_start, span.num_gpus, span.start, span.end, span.component)
        for step in steps
        for span in step.spans
    ]
    spot = config.spot.instances
    return draw_gantt(
        path,
        config.num_gpus + spot * config.rollout.tensor_parallel,
        bars,
        [step.end for step in steps],
        xlabel="simulated time (s)",
        ylabel="GPU" + (" (below the line: preemptible)" if spot else ""),
        title=f"GPU timeline, {len(steps)} steps (dotted: step ends)",
        divider_row=config.num_gpus if spot else None,
    )


def write_chrome_trace(path: Path, steps: list[StepResult]) -> Path:
    return write_phase_trace(path, ((step.index, span) for step in steps for span in step.spans))


def print_run(summary: dict, console: Console) -> None:
    table = Table(title="Step-time breakdown (s from step start; GPU-s busy)", title_justify="left")
    for column in ("step", "time", "component", "start", "end", "GPU-s"):
        table.add_column(column, justify="right")
    for step in summary["steps"]:
        first = True
        for name, part in step["components"].items():
            table.add_row(
                str(step["step"]) if first else "",
                f"{step['step_time_s']:.1f}" if first else "",
                name,
                f"{part['start_s']:.1f}",
                f"{part['end_s']:.1f}",
                f"{part['gpu_s']:.0f}",
            )
            first = False
    console.print(table)
    console.print(
        f"{summary['num_steps']} steps of {summary['samples_per_step']} samples on {summary['num_gpus']} GPUs: "
        f"step {summary['step_time_s']:.1f} s, {summary['throughput_tokens_per_s']:.0f} tokens/s, "
        f"GPU utilization {100 * summary['gpu_utilization']:.1f}%, idle {summary['idle_gpu_s_per_step']:.0f} GPU-s/step, "
        f"trainer bubble {summary['trainer_bubble_s_per_step']:.1f} s/step, "
        f"${summary['cost_usd_per_step']:.2f}/step (${summary['cost_usd_per_mtok']:.3f}/1M tokens), "
        f"{summary['regenerated_tokens']} tokens regenerated; simulated in {summary['wall_time_s']:.2f} s, "
        f"peak memory {summary['peak_memory_mib']:.0f} MiB"
    )
    if summary["manager_processes"]:
        print_manager(summary, console)
    if summary["off_policy"]:
        steady = summary["steady_state_step_time_s"]
        by_staleness = ", ".join(f"{k}: {v}" for k, v in summary["tokens_by_staleness"].items())
        console.print(
            f"off-policy (bound {summary['off_policy']}): steady-state step "
            + (f"{steady:.1f} s" if steady is not None else "n/a (one step)")
            + f"; response tokens trained per staleness {{{by_staleness}}}"
        )
    if summary["partial_rollout"]:
        by_staleness = ", ".join(f"{k}: {v}" for k, v in summary["tokens_by_staleness"].items())
        extra = summary["partial_rollout"]
        if extra == "auto":
            extra = "auto: " + ", ".join(f"+{step['extra_groups']}" for step in summary["steps"])
        else:
            extra = f"+{extra}"
        console.print(
            f"partial rollout ({extra} prompts): {summary['carried_samples']} samples "
            f"({summary['tokens_carried']} tokens) carried to a next step, {summary['reprefill_tokens']} "
            "tokens re-prefilled; "
            f"response tokens trained per staleness {{{by_staleness}}}"
        )


def print_manager(summary: dict, console: Console) -> None:
    """One line: the relay's capacity against the engines' token rate, and whether it bound."""
    verdict = (
        f"the bottleneck: rollout ends {summary['manager_bound_s_per_step']:.1f} s/step later than generated"
        if summary["manager_bottleneck"]
        else "not the bottleneck"
    )
    if summary["manager_max_sample_wait_s"] > 0:
        verdict += f", samples waited for it up to {summary['manager_max_sample_wait_s']:.1f} s"
    console.print(
        f"manager: {summary['manager_processes']} relay processes x "
        f"{summary['manager_cpu_us_per_token']:.2f} us/token relay at most "
        f"{summary['manager_tokens_per_s_capacity']:.0f} tokens/s; the engines generated "
        f"{summary['rollout_generated_tokens_per_s']:.0f} tokens/s during rollout; {verdict} "
        f"(${summary['manager_cost_usd_per_step']:.4f}/step of CPU)"
    )


COMPARE_METRICS = (
    ("step_time_s", "step time (s)", "{:.1f}"),
    ("throughput_tokens_per_s", "tokens/s", "{:.0f}"),
    ("gpu_utilization", "GPU util.", "{:.1%}"),
    ("cost_usd_per_mtok", "$/1M tokens", "{:.3f}"),
    ("regenerated_tokens", "regen. tokens", "{:d}"),
)


def print_compare(results: dict[str, dict], console: Console) -> None:
    table = Table(title="Policies on one workload", title_justify="left")
    table.add_column("policy", no_wrap=True)
    for _, label, _ in COMPARE_METRICS:
        table.add_column(label, justify="right")
    for label in ("step vs first", "tokens/s vs first", "tokens/$ vs first"):
        table.add_column(label, justify="right", no_wrap=True)
    base = next(iter(results.values()))
    for name, row in results.items():
        cells = [fmt.format(row[key]) for key, _, fmt in COMPARE_METRICS]
        table.add_row(
            name,
            *cells,
            f"{row['step_time_s'] / base['step_time_s'] - 1:+.1%}",
            f"{row['throughput_tokens_per_s'] / base['throughput_tokens_per_s']:.2f}x",
            f"{base['cost_usd_per_mtok'] / row['cost_usd_per_mtok'] - 1:+.1%}",  # tokens per $, relative
        )
    print_table(table, console)


def plot_compare(path: Path, results: dict[str, dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
    names = list(results)
    for ax, (key, label, _) in zip(axes, COMPARE_METRICS[:4], strict=True):
        values = [results[n][key] for n in names]
        ax.bar(range(len(names)), values, color="#4C72B0")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
