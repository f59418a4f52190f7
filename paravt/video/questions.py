"""The question families of the needle data: what is asked about a planned video, and its answer.

A builder gets a `Scene` (the target needles, the distractors, the colours on offer, the hint
text) and returns a `Question`: its text with the options block, the answer (a letter, or
"[start, end]" for grounding) and the options. `HINTS` turn `NeedleConfig.hint` into a span
and its words. `paravt.video.synthetic` plans the needles and draws the frames; this module
only words the question, so a new family is one builder and one `FAMILIES` entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from paravt.video import detail


class Needle(Protocol):
    """What a question reads of a planned needle (`paravt.video.synthetic.Needle`)."""

    color: str
    shape: str
    start: int  # first frame

    def window(self, fps: float) -> tuple[float, float]: ...


class NeedleConfig(Protocol):
    """What a hint reads of the generator's config (`paravt.video.synthetic.NeedleConfig`)."""

    duration: float
    coarse_span: int
    exact_span: float


COARSE_PARTS: dict[int, tuple[str, ...]] = {
    2: ("first half", "second half"),
    3: ("first third", "middle third", "last third"),
    4: ("first quarter", "second quarter", "third quarter", "last quarter"),
}
LETTERS = "ABCD"


@dataclass(frozen=True)
class Question:
    """A question as the row stores it: text with its options block, answer, type, options."""

    text: str
    answer: str
    question_type: str
    options: tuple[str, ...] = ()


def _hint_coarse(rng: np.random.Generator, cfg: NeedleConfig) -> tuple[float, float, str]:
    parts = COARSE_PARTS[cfg.coarse_span]
    part = int(rng.integers(len(parts)))
    span = cfg.duration / len(parts)
    return part * span, (part + 1) * span, f"in the {parts[part]} of the video"


def _hint_exact(rng: np.random.Generator, cfg: NeedleConfig) -> tuple[float, float, str]:
    span = min(cfg.exact_span, cfg.duration)
    start = float(rng.integers(0, math.floor(cfg.duration - span) + 1))
    return start, start + span, f"between {start:g} s and {start + span:g} s"


def _hint_none(rng: np.random.Generator, cfg: NeedleConfig) -> tuple[float, float, str]:
    return 0.0, cfg.duration, ""


HINTS: dict[str, Callable[[np.random.Generator, NeedleConfig], tuple[float, float, str]]] = {
    "exact": _hint_exact,
    "coarse": _hint_coarse,
    "none": _hint_none,
}


def _options_block(options: list[str]) -> str:
    return "\nOptions:\n" + "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(options))


@dataclass(frozen=True)
class Scene:
    """What a question builder may look at: the needles, the colours on offer, the hint."""

    targets: tuple[Needle, ...]
    others: tuple[Needle, ...]
    palette: tuple[str, ...]
    hint: str
    fps: float
    shuffle: bool = True
    badge: str = ""  # the corner badge's stripes (family `badge` only)


def _color_question(rng: np.random.Generator, scene: Scene) -> Question:
    needle = scene.targets[0]
    # Distractor colours go first among the wrong options, so the lure is always on offer.
    lures = list(dict.fromkeys(n.color for n in scene.others if n.color != needle.color))
    rest = [c for c in dict.fromkeys(scene.palette) if c != needle.color and c not in lures]
    wrong = lures + [rest[i] for i in rng.permutation(len(rest))]
    options = [needle.color, *wrong[:3]]
    order = rng.permutation(len(options))
    options = (
        [options[i] for i in order] if scene.shuffle else sorted(options, key=scene.palette.index)
    )
    text = f"What colour is the {needle.shape} that appears {scene.hint or 'in the video'}?"
    answer = LETTERS[options.index(needle.color)]
    return Question(text + _options_block(options), answer, "mcq", tuple(options))


def _order_question(rng: np.random.Generator, scene: Scene) -> Question:
    shown = [scene.targets[i] for i in rng.permutation(len(scene.targets))]
    options = [f"{n.color} {n.shape}" for n in shown]
    first = min(range(len(shown)), key=lambda i: shown[i].start)
    where = f" {scene.hint}" if scene.hint else ""
    text = f"Which appears first{where}: the {options[0]} or the {options[1]}?"
    return Question(text + _options_block(options), LETTERS[first], "mcq", tuple(options))


def _ground_question(rng: np.random.Generator, scene: Scene) -> Question:
    needle = scene.targets[0]
    where = f" {scene.hint}" if scene.hint else ""
    text = f"When does the {needle.color} {needle.shape} appear{where}? Answer with [start, end]."
    start, end = needle.window(scene.fps)
    return Question(text, f"[{start}, {end}]", "tvg")


def _badge_question(rng: np.random.Generator, scene: Scene) -> Question:
    needle = scene.targets[0]
    options = detail.badge_options(scene.palette, needle.shape)
    answer = options.index(f"{needle.color} {needle.shape}, {scene.badge} stripes")
    text = detail.badge_text(needle.shape)
    return Question(text + _options_block(options), LETTERS[answer], "mcq", tuple(options))


FAMILIES: dict[str, Callable[[np.random.Generator, Scene], Question]] = {
    "color": _color_question,
    "order": _order_question,
    "ground": _ground_question,
    "badge": _badge_question,
}
