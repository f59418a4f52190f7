"""The `badge` needle family: a detail only a zoom can read (experiment=demo_zoom).

Besides the needle square (shown 3 s, readable in any frame that shows it) every video of this
family carries a small badge near its top-left corner for its whole length: 16 x 16 px of
one-pixel stripes, horizontal or vertical, faded towards the badge's edges. The question asks for
both: the square's colour (find it in time: crop_video) and the stripes' direction (look closer:
zoom). The demo's frames are 128 x 128 px and its overview and crops see them at 64 x 64, the
demo's usual budget. Why the fade: at a 2x downscale PIL's antialiased resize cancels
one-pixel stripes exactly inside the badge, and the fade removes what its edges would leave, so
both badges look alike to within a few grey levels, below the frames' noise; a zoom on
`ZOOM_BOX` (the badge's 32 x 32 px corner, shown at 64 x 64) shows two-pixel stripes.

Options come in a fixed order (square colour, then stripes), the square being one of the
palette's first two colours: A, B = first colour with horizontal / vertical stripes, C, D = the
second colour's. So the square alone, or the badge alone, narrows the answer to two options.
"""

from __future__ import annotations

import numpy as np

BADGES = ("horizontal", "vertical")
BADGE_SIZE = 16  # px, at BADGE_OFFSET from the frame's top-left corner
BADGE_OFFSET = 4
ZOOM_BOX = (0, 0, 250, 250)  # the corner quarter holding the badge, Qwen3-VL's 0-1000 grid
SQUARE_COLOURS = 2  # the square takes one of the palette's first two colours


def badge_pixels(direction: str) -> np.ndarray:
    """The badge's grey levels [S, S] uint8: one-pixel stripes under a sine fade to the edges."""
    if direction not in BADGES:
        raise ValueError(f"badge must be one of {BADGES}, got {direction!r}")
    fade = np.sin(np.pi * (np.arange(BADGE_SIZE) + 0.5) / BADGE_SIZE)
    stripes = (-1.0) ** np.arange(BADGE_SIZE)
    wave = stripes[:, None] if direction == "horizontal" else stripes[None, :]
    return np.clip(128 + 127 * np.outer(fade, fade) * wave, 0, 255).astype(np.uint8)


def draw_badge(frame: np.ndarray, direction: str) -> None:
    """Paint the badge into `frame` [H, W, 3] in place (grey: every channel alike)."""
    top = BADGE_OFFSET
    frame[top : top + BADGE_SIZE, top : top + BADGE_SIZE] = badge_pixels(direction)[:, :, None]


def badge_options(palette: tuple[str, ...], shape: str) -> list[str]:
    """The four options in their fixed order (module docstring)."""
    return [f"{c} {shape}, {b} stripes" for c in palette[:SQUARE_COLOURS] for b in BADGES]


def badge_text(shape: str) -> str:
    return (
        f"What colour is the {shape} that appears in the video, and which way do the stripes "
        "of the small badge in the top-left corner run?"
    )
