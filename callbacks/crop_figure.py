"""The crop-timeline figure a person reads at a glance: axis in seconds, truth, labelled rows.

`timeline_figure` frames the bars of `paravt.callbacks.rollout_logger.draw_crop_timeline` with a
title (sample id, step, frame budget), one label per rollout (its reward and answer), a time axis
with ticks in seconds and a legend. Drawn with Pillow (a dependency already; matplotlib is not), so
it is pure image code: plain values in, an [H, W, 3] uint8 array out. It does not pick rollouts
or read trajectories; RolloutLogger does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

INK = (40, 40, 40)
PLOT_WIDTH = 560
LABEL_WIDTH = 250
MARGIN = 12
ROW_HEIGHT = 22
FONT_SIZE = 12
LINE = 16  # height of one text line at FONT_SIZE
PLOT_TOP = MARGIN + LINE + 6  # the bars' top-left corner is (PLOT_TOP, MARGIN) in [y, x]


def nice_ticks(duration: float, max_ticks: int = 8) -> list[float]:
    """Tick positions 0, s, 2s, ... <= duration with s in {1, 2, 5} x 10^k and at most
    `max_ticks` + 1 ticks (e.g. 100 s -> every 20 s: 0, 20, ..., 100)."""
    if not (math.isfinite(duration) and duration > 0):
        raise ValueError(f"duration must be a positive number of seconds, got {duration!r}")
    raw = duration / max_ticks
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    count = math.floor(duration / step + 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def _font() -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=FONT_SIZE)
    except TypeError:  # Pillow < 10.1: a fixed bitmap font
        return ImageFont.load_default()


def _fmt_seconds(t: float) -> str:
    return f"{t:g}"


def timeline_figure(
    bars: np.ndarray,  # [R * ROW_HEIGHT, PLOT_WIDTH, 3] from draw_crop_timeline
    duration: float,
    labels: Sequence[str],  # [R] one per rollout row
    title: str,
    legend: str,
) -> np.ndarray:  # [H, W, 3] uint8
    """Frame the bars with title, row labels, a seconds axis with ticks and a legend line."""
    rows = bars.shape[0] // ROW_HEIGHT
    if bars.shape[1] != PLOT_WIDTH or len(labels) not in (rows, 0):
        raise ValueError(
            f"bars must be {PLOT_WIDTH} px wide with one label per {ROW_HEIGHT} px row; got "
            f"{bars.shape[1]} px and {len(labels)} labels for {rows} rows"
        )
    font = _font()
    top = PLOT_TOP
    width = MARGIN + PLOT_WIDTH + LABEL_WIDTH
    height = top + bars.shape[0] + 6 + LINE + 6 + LINE + MARGIN
    image = Image.new("RGB", (width, height), (255, 255, 255))
    image.paste(Image.fromarray(bars), (MARGIN, top))
    draw = ImageDraw.Draw(image)
    draw.text((MARGIN, MARGIN), title, fill=INK, font=font)
    for r, label in enumerate(labels):
        y = top + r * ROW_HEIGHT + (ROW_HEIGHT - LINE) // 2
        draw.text((MARGIN + PLOT_WIDTH + 8, y), label, fill=INK, font=font)
    axis_y = top + bars.shape[0]
    draw.line([(MARGIN, axis_y), (MARGIN + PLOT_WIDTH, axis_y)], fill=INK)
    for t in nice_ticks(duration):
        x = MARGIN + round(t / duration * PLOT_WIDTH)
        draw.line([(x, axis_y), (x, axis_y + 4)], fill=INK)
        text = _fmt_seconds(t)
        draw.text((x - 3 * len(text), axis_y + 6), text, fill=INK, font=font)
    draw.text((MARGIN + PLOT_WIDTH + 8, axis_y + 6), "time (s)", fill=INK, font=font)
    draw.text((MARGIN, axis_y + 6 + LINE + 6), legend, fill=INK, font=font)
    return np.asarray(image, dtype=np.uint8)
