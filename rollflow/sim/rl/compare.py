"""`rollflow rl-sim compare`: the config's policies side by side on one workload."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from rollflow.config import ConfigError, load_config
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.report import COMPARE_METRICS, plot_compare, print_compare
from rollflow.sim.rl.runner import run_rl


def run_compare(
    path: str, overrides: list[str], output_dir: str | None, plots: bool = True
) -> dict[str, dict]:
    """Run each `compare` variant (its overrides after the command line's); write compare.json and
    (with `plots`) compare.png."""
    base = load_config(RLSimConfig, path, overrides)
    if not base.compare:
        raise ConfigError(f"config error: compare: {path} lists no variants to compare")
    out_dir = Path(output_dir or base.output.dir)
    console = Console(stderr=True)
    results: dict[str, dict] = {}
    for variant in base.compare:
        extra = [*overrides, *variant.overrides, f"output.dir={out_dir / variant.name}"]
        try:
            config = load_config(RLSimConfig, path, extra)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in compare variant {variant.name!r})") from None
        console.print(f"[bold]{variant.name}[/bold]: {' '.join(variant.overrides) or '(config as is)'}")
        summary = run_rl(config, console=console, print_tables=False)
        results[variant.name] = {key: summary[key] for key, _, _ in COMPARE_METRICS} | {
            "steady_state_step_time_s": summary["steady_state_step_time_s"],
            "tokens_per_usd": summary["tokens_per_usd"],
            "off_policy": summary["off_policy"],
            "tokens_by_staleness": summary["tokens_by_staleness"],
            "idle_gpu_s_per_step": summary["idle_gpu_s_per_step"],
            "trainer_bubble_s_per_step": summary["trainer_bubble_s_per_step"],
            "cost_usd_per_step": summary["cost_usd_per_step"],
            "preemptions": summary["preemptions"],
            "overrides": variant.overrides,
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "compare.json"]
    written[0].write_text(json.dumps(results, indent=2) + "\n")
    if plots:
        written.append(plot_compare(out_dir / "compare.png", results))
    print_compare(results, Console())
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    return results
