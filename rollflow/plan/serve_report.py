"""Outputs of a serving search: results.csv/json, Pareto PNGs, and the best configuration's command."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from rollflow.console_table import print_table
from rollflow.plan.evaluate import with_slo_percentiles
from rollflow.plan.pareto import plot_front
from rollflow.plan.serve_config import ServeSearchConfig
from rollflow.plan.space import KNOBS, apply_knobs


def write_results(out: Path, rows: list[dict], config: ServeSearchConfig, console: Console) -> None:
    metric_names = [slo.name for slo in config.slos]
    columns = [
        *KNOBS,
        "gpus",
        "cost_per_hour",
        "max_qps",
        "qps_per_dollar",
        *metric_names,
        "simulations",
        "seconds",
        "skipped",
    ]
    public = [{c: row.get(c) for c in columns} for row in rows]
    (out / "results.json").write_text(json.dumps(public, indent=1))
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(public)
    served = [r for r in rows if not r["skipped"] and r["max_qps"] > 0]
    written = [out / "results.json", out / "results.csv"]
    for name in metric_names:
        if served:
            path = out / f"pareto_{name}.png"
            plot_front(
                path,
                [r["qps_per_dollar"] for r in served],
                [r[name] for r in served],
                "QPS per $/hour",
                f"{name} at max QPS (s)",
                f"capacity per dollar vs {name}",
            )
            written.append(path)
    _print_table(rows, metric_names, console)
    skipped = [r for r in rows if r["skipped"]]
    for row in skipped:
        console.print(f"skipped {_label(row)}: {row['skipped']}")
    if served:
        best = max(served, key=lambda r: r["qps_per_dollar"])
        _print_best(out, best, config, console)
        written.append(out / "best.yaml")
    else:
        console.print("no configuration meets the SLOs at any QPS tried")
    console.print(f"wrote {', '.join(str(p) for p in written)}")


def _label(row: dict) -> str:
    """Compact name of a configuration, e.g. `a100 tp2 pp1 x2 sarathi/512 cap128 round_robin`."""
    scheduler = row["scheduler"] + (f"/{row['chunk_size']}" if row["chunk_size"] is not None else "")
    return (
        f"{row['device']} tp{row['tensor_parallel']} pp{row['pipeline_stages']} x{row['replicas']} "
        f"{scheduler} cap{row['batch_size_cap']} {row['router']}"
    )


def _print_table(rows: list[dict], metric_names: list[str], console: Console) -> None:
    table = Table(title="max QPS under the SLOs, per configuration")
    for column in ("configuration", "max QPS", "QPS per $/h", *metric_names, "sims"):
        table.add_column(column)
    for row in sorted(rows, key=lambda r: -r["qps_per_dollar"]):
        metrics = [f"{row[m]:.3f}" if row.get(m) is not None else "-" for m in metric_names]
        table.add_row(
            _label(row),
            f"{row['max_qps']:.2f}",
            f"{row['qps_per_dollar']:.3f}",
            *metrics,
            str(row["simulations"]),
        )
    print_table(table, console)


def _print_best(out: Path, best: dict, config: ServeSearchConfig, console: Console) -> None:
    raw = with_slo_percentiles(apply_knobs(config.simulation, best, best["max_qps"]), config.slos)
    raw.setdefault("output", {})["dir"] = str(out / "best")
    path = out / "best.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    console.print(
        f"best: {_label(best)}: {best['max_qps']:.2f} QPS, {best['qps_per_dollar']:.3f} QPS per $/hour"
    )
    console.print(f"reproduce: .venv/bin/rollflow sim serve --config {path}")
    console.print(yaml.safe_dump(raw, sort_keys=False), markup=False, highlight=False)
