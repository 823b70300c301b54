"""Line charts drawn straight onto a Pillow image: the two PNG figures of a simulation.

A simulation's figures are a few lines on linear axes with ticks, a grid, labels and a legend.
matplotlib drew them in about 0.75 CPU s here (0.36 of it importing matplotlib, 0.2 per figure
laying out tick and text artists, PNG encoding), more than everything else a run does around
its loop; Pillow draws the same in under a tenth of that. Everything is drawn at twice the size
and halved at the end, which smooths the lines as anti-aliasing would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

SCALE = 2  # drawn at this multiple of the saved size, then reduced: smooth edges
COLORS = (  # matplotlib's default cycle, so figures look as they did
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
GRID = (229, 229, 229)
TICK_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)  # per decade, as matplotlib's default locator picks them
MARGIN = 0.05  # of the data range on each side
POINT = 110 / 72 * SCALE  # drawn pixels per point: line widths are in points, at 110 dpi


@dataclass
class _Series:
    xs: np.ndarray
    ys: np.ndarray
    color: str
    width: float
    label: str | None


@dataclass
class Axes:
    """One panel: a box in figure pixels, its series, and what is written around it."""

    box: tuple[int, int, int, int]  # left, top, right, bottom, in drawn pixels
    series: list[_Series] = field(default_factory=list)
    vlines: list[float] = field(default_factory=list)
    xlabel: str = ""
    ylabel: str = ""
    xticklabels: bool = True
    legend_columns: int = 0  # 0: no legend

    def plot(self, xs: np.ndarray, ys: np.ndarray, width: float = 1.0, label: str | None = None) -> None:
        """A line through the points, in the next colour of the cycle; points that are not
        finite are left out."""
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        finite = np.isfinite(xs) & np.isfinite(ys)
        color = COLORS[len(self.series) % len(COLORS)]
        self.series.append(_Series(xs[finite], ys[finite], color, width, label))

    def step(self, xs: np.ndarray, ys: np.ndarray, width: float = 1.0, label: str | None = None) -> None:
        """A value holds from its x until the next x (matplotlib's `where="post"`)."""
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        self.plot(np.repeat(xs, 2)[1:], np.repeat(ys, 2)[:-1], width, label)

    def x_limits(self) -> tuple[float, float]:
        return _limits([s.xs for s in self.series])

    def y_limits(self) -> tuple[float, float]:
        return _limits([s.ys for s in self.series])


class Figure:
    """A white canvas of `width` x `height` saved pixels holding panels and a title."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.image = Image.new("RGB", (width * SCALE, height * SCALE), "white")
        self.draw = ImageDraw.Draw(self.image)
        self.font = ImageFont.load_default(15 * SCALE)
        self.small_font = ImageFont.load_default(12 * SCALE)
        self.title_font = ImageFont.load_default(18 * SCALE)
        self.axes: list[Axes] = []
        self.title = ""

    def add_axes(self, left: float, top: float, right: float, bottom: float) -> Axes:
        """A panel whose box is given in fractions of the figure, from its top-left corner."""
        w, h = self.width * SCALE, self.height * SCALE
        axes = Axes((round(left * w), round(top * h), round(right * w), round(bottom * h)))
        self.axes.append(axes)
        return axes

    def save(self, path: Path, shared_x: bool = False) -> Path:
        """Draw every panel (on one x range when `shared_x`) and write the PNG."""
        x_range = _limits([s.xs for axes in self.axes for s in axes.series]) if shared_x else None
        for axes in self.axes:
            self._draw_axes(axes, x_range or axes.x_limits())
        if self.title:
            self._text((self.width * SCALE // 2, 8 * SCALE), self.title, self.title_font, anchor="mt")
        self.image.reduce(SCALE).save(path, format="PNG", compress_level=3)
        return path

    def _draw_axes(self, axes: Axes, x_range: tuple[float, float]) -> None:
        left, top, right, bottom = axes.box
        (x0, x1), (y0, y1) = x_range, axes.y_limits()

        def px(x: np.ndarray | float) -> np.ndarray | float:
            return left + (np.asarray(x) - x0) * ((right - left) / (x1 - x0))

        def py(y: np.ndarray | float) -> np.ndarray | float:
            return bottom - (np.asarray(y) - y0) * ((bottom - top) / (y1 - y0))

        tick = 4 * SCALE
        for value, text in _ticks(x0, x1, right - left):
            x = round(float(px(value)))
            self.draw.line([(x, top), (x, bottom)], fill=GRID, width=SCALE)
            self.draw.line([(x, bottom), (x, bottom + tick)], fill="black", width=SCALE)
            if axes.xticklabels:
                self._text((x, bottom + tick + 3 * SCALE), text, self.font, anchor="mt")
        for value, text in _ticks(y0, y1, bottom - top):
            y = round(float(py(value)))
            self.draw.line([(left, y), (right, y)], fill=GRID, width=SCALE)
            self.draw.line([(left - tick, y), (left, y)], fill="black", width=SCALE)
            self._text((left - tick - 4 * SCALE, y), text, self.font, anchor="rm")
        for x in axes.vlines:
            xp = round(float(px(x)))
            for y in range(top, bottom, 4 * SCALE):  # dotted
                self.draw.line([(xp, y), (xp, min(y + SCALE, bottom))], fill="grey", width=SCALE)
        for series in axes.series:
            points = np.column_stack([px(series.xs), py(series.ys)]).ravel().tolist()
            if len(points) >= 4:
                self.draw.line(points, fill=series.color, width=max(1, round(series.width * POINT)))
        self.draw.rectangle([left, top, right, bottom], outline="black", width=SCALE)
        if axes.xlabel:
            self._text(((left + right) // 2, bottom + 25 * SCALE), axes.xlabel, self.font, anchor="mt")
        if axes.ylabel:
            self._vertical_text((left - 48 * SCALE, (top + bottom) // 2), axes.ylabel)
        if axes.legend_columns:
            self._legend(axes)

    def _legend(self, axes: Axes) -> None:
        entries = [s for s in axes.series if s.label]
        if not entries:
            return
        left, top = axes.box[0] + 6 * SCALE, axes.box[1] + 6 * SCALE
        pad, sample = 5 * SCALE, 22 * SCALE
        widths = [self.draw.textlength(s.label, font=self.small_font) for s in entries]
        cell = sample + 6 * SCALE + max(widths) + 12 * SCALE
        row_height = 16 * SCALE
        rows = math.ceil(len(entries) / axes.legend_columns)
        columns = min(len(entries), axes.legend_columns)
        box = [left, top, left + 2 * pad + columns * cell, top + 2 * pad + rows * row_height]
        self.draw.rectangle(box, fill="white", outline=(204, 204, 204), width=SCALE)
        for i, series in enumerate(entries):
            x = left + pad + (i % axes.legend_columns) * cell
            y = top + pad + (i // axes.legend_columns) * row_height + row_height // 2
            self.draw.line(
                [(x, y), (x + sample, y)], fill=series.color, width=max(1, round(series.width * SCALE))
            )
            self._text((x + sample + 6 * SCALE, y), series.label or "", self.small_font, anchor="lm")

    def _text(self, at: tuple[float, float], text: str, font: ImageFont.FreeTypeFont, anchor: str) -> None:
        self.draw.text(at, text, fill="black", font=font, anchor=anchor)

    def _vertical_text(self, center: tuple[int, int], text: str) -> None:
        """Text turned a quarter to the left, centred on `center` (a y-axis label)."""
        left, top, right, bottom = self.font.getbbox(text)
        mask = Image.new("L", (right - left, bottom - top), 0)
        ImageDraw.Draw(mask).text((-left, -top), text, fill=255, font=self.font)
        mask = mask.rotate(90, expand=True)
        at = (center[0] - mask.width // 2, center[1] - mask.height // 2)
        self.image.paste((0, 0, 0), at, mask)


def _limits(arrays: list[np.ndarray]) -> tuple[float, float]:
    """The data's range widened by MARGIN on each side (by MARGIN of the value around a single
    value); (0, 1) without data."""
    values = [a for a in arrays if len(a)]
    if not values:
        return 0.0, 1.0
    lo = min(float(np.min(a)) for a in values)
    hi = max(float(np.max(a)) for a in values)
    if hi == lo:
        span = abs(lo) or 1.0
        return lo - MARGIN * span, hi + MARGIN * span
    pad = MARGIN * (hi - lo)
    return lo - pad, hi + pad


def _ticks(lo: float, hi: float, length: int) -> list[tuple[float, str]]:
    """Round tick values inside [lo, hi] on an axis `length` drawn pixels long, with their labels:
    at most 9 intervals and about one per 45 saved pixels, as matplotlib's default locator."""
    raw = (hi - lo) / max(1, min(9, length // (45 * SCALE)))
    decade = 10.0 ** math.floor(math.log10(raw))
    step = next(s * decade for s in TICK_STEPS if s * decade >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9)
    values = [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]
    decimals = next((d for d in range(17) if abs(round(step, d) - step) < step * 1e-6), 17)
    texts = [f"{value:.{decimals}f}" for value in values]
    return [
        (v, t[1:] if t.startswith("-") and not float(t) else t) for v, t in zip(values, texts, strict=True)
    ]
