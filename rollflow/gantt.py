"""The devices x time chart `rollflow rl-sim` and the live dynamic demo both draw, so a simulated
step and a run one look alike: light bars where a component holds a device, colored bars where it
works, dotted lines at step ends."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

COLORS = {
    "rollout": "#4C72B0",
    "rollout_spot": "#8172B2",
    "inference": "#55A868",
    "training": "#C44E52",
    "reshard": "#DD8452",
    "sync": "#937860",
}
HELD = "#DDDDDD"


@dataclass(frozen=True)
class Bar:
    row: int  # first device
    rows: int  # devices it covers
    start: float
    end: float
    component: str | None  # a key of COLORS; None: held, idle


def draw_gantt(
    path: Path,
    num_rows: int,
    bars: list[Bar],
    step_ends: list[float],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    held_label: str = "rollout instance idle",
    divider_row: int | None = None,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(13, max(3.6, min(12.0, 0.12 * num_rows + 2))))
    for bar in sorted(bars, key=lambda b: b.component is not None):  # held first, work on top
        color = HELD if bar.component is None else COLORS[bar.component]
        ax.broken_barh([(bar.start, bar.end - bar.start)], (bar.row, bar.rows), color=color, lw=0)
    for end in step_ends:
        ax.axvline(end, color="black", lw=0.6, ls=":")
    if divider_row is not None:
        ax.axhline(divider_row, color="black", lw=0.8)
    ax.set_ylim(num_rows, 0)
    if num_rows <= 16:  # few rows: name each one
        ax.set_yticks([row + 0.5 for row in range(num_rows)], [str(row) for row in range(num_rows)])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    handles = [Patch(color=c, label=n) for n, c in COLORS.items()]
    handles.append(Patch(color=HELD, label=held_label))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=7, fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
