"""`rollflow router compare`: every router on the same held-out workloads; table, plot, compare.json."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rollflow.console_table import print_table
from rollflow.learn.config import LearnConfig
from rollflow.learn.evaluate import TimedRouter, decision_latency_us, run_router, summarize_latencies
from rollflow.policy.learned import load_learned_router
from rollflow.policy.routing import make_router

BASELINES = ("round_robin", "lor", "least_tokens")
COMPARED = (*BASELINES, "least_outstanding", "random")


def policy_path(config: LearnConfig, override: str | None = None) -> Path:
    return Path(override or config.policy_file or Path(config.output_dir) / "policy.npz")


def compare(
    config: LearnConfig, policy: Path, out_dir: Path, console: Console
) -> dict[str, dict[str, float]]:
    """Run the heuristics and the learned router on scenario.eval_seeds; write compare.json and a plot."""
    scenario = config.scenario
    results: dict[str, dict[str, float]] = {}
    for name in COMPARED:
        with console.status(f"simulating {name}"):
            latencies = run_router(
                config, make_router(name, seed=config.seed), scenario.eval_seeds, scenario.eval_requests
            )
        results[name] = summarize_latencies(config, latencies)
    learned = TimedRouter(load_learned_router(policy))
    with console.status("simulating learned"):
        latencies = run_router(config, learned, scenario.eval_seeds, scenario.eval_requests)
    results["learned"] = summarize_latencies(config, latencies)
    decision = decision_latency_us(learned)
    best = min(BASELINES, key=lambda name: results[name]["e2e_p99"])
    delta = results["learned"]["e2e_p99"] / results[best]["e2e_p99"] - 1  # < 0: learned is better
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(json.dumps(results, indent=2) + "\n")
    _print_table(results, console)
    console.print(
        f"learned vs best of {'/'.join(BASELINES)} ({best}): Δ p99 E2E {100 * delta:+.1f}% "
        f"({'better' if delta < 0 else 'worse'}); decision latency median {decision['median_us']:.1f} us, mean {decision['mean_us']:.1f} us, "
        f"p99 {decision['p99_us']:.1f} us over {len(learned.decision_ns)} decisions"
    )
    written = [out_dir / "compare.json", _plot(results, out_dir)]
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    return results


def _print_table(results: dict[str, dict[str, float]], console: Console) -> None:
    table = Table(title="held-out workloads")
    for column in ("router", "E2E p99 s", "E2E mean s", "TTFT p99 s", "TTFT mean s", "SLO met"):
        table.add_column(column, justify="right")
    for name, row in results.items():
        table.add_row(
            name,
            f"{row['e2e_p99']:.2f}",
            f"{row['e2e_mean']:.2f}",
            f"{row['ttft_p99']:.2f}",
            f"{row['ttft_mean']:.2f}",
            f"{100 * row['slo_attainment']:.1f}%",
        )
    print_table(table, console)


def _plot(results: dict[str, dict[str, float]], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    panels = (
        ("e2e_p99", "E2E p99 (s)"),
        ("e2e_mean", "E2E mean (s)"),
        ("ttft_p99", "TTFT p99 (s)"),
        ("slo_attainment", "SLO attainment"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5))
    for ax, (key, label) in zip(axes, panels, strict=True):
        colors = ["tab:orange" if "learned" in n else "tab:blue" for n in names]
        ax.bar(names, [results[n][key] for n in names], color=colors)
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    path = out_dir / "compare.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
