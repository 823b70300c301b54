"""The simulator's figures: round ticks, curves where their data says, the size asked for."""

import numpy as np
from PIL import Image

from rollflow.sim.chart import COLORS, SCALE, Figure, _limits, _ticks


def test_ticks_are_round_steps_inside_the_range():
    assert [text for _, text in _ticks(-0.05, 1.05, 290 * SCALE)] == [
        "0.0",
        "0.2",
        "0.4",
        "0.6",
        "0.8",
        "1.0",
    ]
    assert [text for _, text in _ticks(-52.7, 1108.0, 1100 * SCALE)] == [
        "0",
        "200",
        "400",
        "600",
        "800",
        "1000",
    ]
    assert [text for _, text in _ticks(0.0055, 0.079, 390 * SCALE)] == [
        "0.01",
        "0.02",
        "0.03",
        "0.04",
        "0.05",
        "0.06",
        "0.07",
    ]
    assert [text for _, text in _ticks(-5.0, 5.0, 300 * SCALE)] == ["-4", "-2", "0", "2", "4"]
    tiny = _ticks(0.05, 0.05 + 1e-14, 300 * SCALE)  # nearly equal latencies still get ticks
    assert tiny and all(0.05 <= value <= 0.05 + 1e-14 for value, _ in tiny)


def test_limits_widen_the_data_by_a_margin():
    assert _limits([np.array([0.0, 10.0])]) == (-0.5, 10.5)
    assert _limits([np.array([3.0])]) == (3.0 - 0.15, 3.0 + 0.15)
    assert _limits([]) == (0.0, 1.0)


def test_a_step_curve_is_drawn_in_its_colour_where_its_values_are(tmp_path):
    fig = Figure(400, 300)
    ax = fig.add_axes(0.1, 0.1, 0.9, 0.9)
    ax.step(np.array([0.0, 5.0, 10.0, np.nan]), np.array([0.0, 10.0, 10.0, 3.0]), width=2, label="replica 0")
    ax.legend_columns = 1
    path = fig.save(tmp_path / "step.png")
    image = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert image.shape == (300, 400, 3)
    blue = np.array([int(COLORS[0][i : i + 2], 16) for i in (1, 3, 5)])
    near_blue = (np.abs(image - blue).sum(axis=2) < 60).nonzero()
    assert len(near_blue[0]) > 100
    # data x 0..10 spans pixels 40..360 less a 5% margin each side: the rise at x=5 is at pixel 200
    rise = [x for y, x in zip(*near_blue, strict=True) if 120 < y < 180]
    assert rise and all(abs(x - 200) <= 3 for x in rise)
