"""`reference/metrics.md`: the manager's Prometheus metrics, read from its own registry."""

from __future__ import annotations

from tools.docs_site.markdown import cell, code, table

SUFFIXES = {"counter": ["_total"]}  # a histogram is named by its base; its series add suffixes


def metric_rows() -> list[tuple[str, str, str, str]]:
    """(name as scraped, type, labels, help) of every metric a fresh manager registers."""
    from rollflow.runtime.manager.core.metrics import ManagerMetrics

    registry = ManagerMetrics().registry
    rows = []
    for collector in list(registry._collector_to_names):
        if hasattr(collector, "_labelnames"):  # a prometheus_client metric
            families = [(collector._name, collector._type, collector._labelnames, collector._documentation)]
        else:  # a custom collector: its families say their labels
            families = [(f.name, f.type, f._labelnames, f.documentation) for f in collector.collect()]
        for name, kind, labels, help in families:
            scraped = ", ".join(name + suffix for suffix in SUFFIXES.get(kind, [""]))
            rows.append((scraped, kind, ", ".join(labels), help))
    return sorted(rows)


def page() -> str:
    rows = [(code(name), kind, code(labels), cell(help)) for name, kind, labels, help in metric_rows()]
    return "\n".join(
        [
            "# Metrics reference\n",
            "The rollout manager's Prometheus metrics, served at `GET /metrics`, read from its metric "
            "registry at build time. A histogram is scraped as its `_bucket`, `_sum` and `_count` series.\n",
            table(["metric", "type", "labels", "meaning"], rows),
        ]
    )
