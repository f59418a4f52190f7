"""A line chart a person reads at a glance: ticks on both axes, a titled step axis, a legend
beside the plot (never over the data), and series that stay visible where they overlap.

Pure Pillow drawing (no plotting library): named series of (x, y) points in, a PIL image out.
`paravt.run.curves` feeds it the scalars a run logged. Overlapping series (e.g. the gate ratio
of K = 2 and K = 4, both 1.0) are drawn widest first with distinct markers, so the one drawn
later never hides the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Series = Sequence[tuple[float, float]]

COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14))
INK, GRID = (40, 40, 40), (225, 225, 225)
FONT_SIZE, LINE = 12, 16
LEFT, TOP, BOTTOM_PAD, LEGEND_WIDTH = 64, 34, 44, 190


def _font():
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=FONT_SIZE)  # a scalable font: spaces keep their width
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def nice_ticks(lo: float, hi: float, max_ticks: int = 6, integer: bool = False) -> list[float]:
    """Ticks k * s within [lo, hi], s in {1, 2, 5} x 10^n (>= 1 when `integer`: steps), at most
    `max_ticks` + 1 of them."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        raise ValueError(f"need a finite range lo < hi, got [{lo!r}, {hi!r}]")
    raw = (hi - lo) / max_ticks
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    step = max(step, 1) if integer else step
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [round(k * step, 10) for k in range(first, last + 1)]


def _bounds(series: Mapping[str, Series], x_range) -> tuple[float, float, float, float]:
    xs = [x for s in series.values() for x, _ in s]
    ys = [y for s in series.values() for _, y in s]
    x0, x1 = x_range if x_range else (min(xs), max(xs))
    y0, y1 = min(ys), max(ys)
    if x1 <= x0:
        x1 = x0 + 1
    pad = (y1 - y0) * 0.08 or max(abs(y0) * 0.1, 0.5)
    return x0, x1, y0 - pad, y1 + pad


def _marker(draw, kind: int, x: float, y: float, r: float, colour) -> None:
    box = (x - r, y - r, x + r, y + r)
    if kind == 0:
        draw.ellipse(box, outline=colour, width=2)
    elif kind == 1:
        draw.rectangle(box, fill=colour)
    elif kind == 2:
        draw.polygon([(x, y - r), (x + r, y + r), (x - r, y + r)], fill=colour)
    else:
        draw.polygon([(x, y - r), (x + r, y), (x, y + r), (x - r, y)], fill=colour)


def _label(value: float) -> str:
    return f"{value:.4g}"


def line_chart(
    series: Mapping[str, Series],
    title: str,
    size=(760, 400),
    x_label: str = "step",
    x_range: tuple[float, float] | None = None,
):
    """A PIL image: one polyline with markers per named series, ticked axes, legend at right.

    `x_range` fixes the step axis (e.g. the whole run) when a series was logged on part of it.
    """
    from PIL import Image, ImageDraw

    font = _font()
    width, height = size
    right, bottom = width - LEGEND_WIDTH, height - BOTTOM_PAD
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    draw.text((LEFT, 10), title, fill=INK, font=font)
    series = {name: s for name, s in series.items() if s}
    if not series:
        draw.rectangle((LEFT, TOP, right, bottom), outline=INK)
        draw.text((LEFT + 10, TOP + 10), "no data logged", fill=INK, font=font)
        return img
    x0, x1, y0, y1 = _bounds(series, x_range)

    def at(x: float, y: float) -> tuple[float, float]:
        return (
            LEFT + (x - x0) / (x1 - x0) * (right - LEFT),
            bottom - (y - y0) / (y1 - y0) * (bottom - TOP),
        )

    for value in nice_ticks(y0, y1):
        _, py = at(x0, value)
        draw.line([(LEFT, py), (right, py)], fill=GRID)
        draw.line([(LEFT - 4, py), (LEFT, py)], fill=INK)
        text = _label(value)
        w = draw.textlength(text, font=font)
        draw.text((LEFT - 8 - w, py - LINE // 2), text, fill=INK, font=font)
    for value in nice_ticks(x0, x1, 8, integer=x_label == "step"):
        px, _ = at(value, y0)
        draw.line([(px, bottom), (px, bottom + 4)], fill=INK)
        text = _label(value)
        w = draw.textlength(text, font=font)
        draw.text((px - w / 2, bottom + 6), text, fill=INK, font=font)
    w = draw.textlength(x_label, font=font)
    draw.text(((LEFT + right - w) / 2, bottom + 6 + LINE), x_label, fill=INK, font=font)
    draw.rectangle((LEFT, TOP, right, bottom), outline=INK)
    count = len(series)
    for i, (name, points) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        line_width = 2 * (count - i) + 1  # widest first: a later series never hides it
        xy = [at(x, y) for x, y in points]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=line_width)
        for px, py in xy:
            _marker(draw, i % 4, px, py, 2 + line_width / 2, colour)
        ly = TOP + 4 + i * (LINE + 4)
        mid = ly + LINE // 2
        draw.line([(right + 12, mid), (right + 34, mid)], fill=colour, width=3)
        _marker(draw, i % 4, right + 23, mid, 4, colour)
        draw.text((right + 40, ly), name, fill=INK, font=font)
    return img
