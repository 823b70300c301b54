"""Pareto fronts: points no other point beats on both axes."""

from __future__ import annotations


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points maximising x (capacity per $) while minimising y (a latency), sorted by y."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0]))
    front, best_x = [], float("-inf")
    for i in order:
        if points[i][0] > best_x:
            front.append(i)
            best_x = points[i][0]
    return front


def plot_front(path, xs: list[float], ys: list[float], xlabel: str, ylabel: str, title: str) -> None:
    """Scatter of every configuration with its front drawn, in the style of Vidur's README figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = pareto_front(list(zip(xs, ys, strict=True)))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(ys, xs, s=18, color="0.6", label="configurations")
    ax.plot([ys[i] for i in front], [xs[i] for i in front], "o-", color="tab:red", label="Pareto front")
    ax.set_xlabel(ylabel)
    ax.set_ylabel(xlabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
