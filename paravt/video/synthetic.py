"""Needle-in-a-video data: long, mostly uninformative videos with short coloured shapes in them.

Every video is a slowly drifting grey background with mild noise (frames differ, but carry no
information) in which a few "needles" — a square, circle or triangle of a palette colour — are
shown for `needle_seconds` each. Some are the targets of the question, the others are distractors
of a different kind. Three question families:
    color   (mcq)  "What colour is the square that appears in the second half of the video?"
    order   (mcq)  "Which appears first ...: the red square or the blue circle?"
    ground  (tvg)  "When does the red square appear ...?"  ->  "[12.0, 15.0]"
    badge   (mcq)  "What colour is the square ..., and which way do the stripes of the small
                   badge in the top-left corner run?" (paravt.video.detail: needs a zoom)
Rows follow the RL data schema (docs/method.md section 8) with video paths relative to the data
file.

Why the defaults need search (docs/method.md section 10: an exact hint makes the task too easy
for RL):
64 s at 2 fps with a 3 s needle. A 4-frame overview samples t = 8, 24, 40, 56 s, so a needle is
seen with probability ~ 4 * 3 / 64 ~ 0.19 (8 frames: ~ 0.38): the overview usually misses it.
The default hint is coarse ("in the second half"): a 32 s span, twice what one crop shows at
1 fps with its 16-frame cap, so covering the span at 1 fps takes two or more parallel crops.
(A single crop over the whole 32 s still samples every 2 s and glimpses a 3 s needle once or
twice; set needle_seconds below 2 or duration to 128 to make single wide crops miss too.) One
distractor per video, placed anywhere, must be told apart by shape or colour.

This module plans and draws the data; `paravt.video.questions` words the questions, encoding is
`paravt.video.writer`'s job, and it does not read anything back (`paravt.video.reader`,
`paravt.data`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paravt.progress import track
from paravt.video import detail
from paravt.video.questions import COARSE_PARTS, FAMILIES, HINTS, LETTERS, Scene
from paravt.video.writer import write_video

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 190, 50),
    "blue": (40, 70, 230),
    "yellow": (235, 215, 30),
    "purple": (150, 50, 210),
    "orange": (245, 140, 20),
    "cyan": (30, 200, 210),
    "pink": (240, 90, 180),
}
SPLIT_STREAMS: dict[str, int] = {"train": 0, "eval": 1}  # independent seed streams per split


# Masks of a needle of side s, from the row (y) and column (x) grids of its box.
SHAPES: dict[str, Callable[[np.ndarray, np.ndarray, int], np.ndarray]] = {
    "square": lambda y, x, s: np.ones((s, s), dtype=bool),
    "circle": lambda y, x, s: (x - (s - 1) / 2) ** 2 + (y - (s - 1) / 2) ** 2 <= (s / 2) ** 2,
    "triangle": lambda y, x, s: np.abs(x - (s - 1) / 2) <= (y + 1) / 2,  # apex up
}
TARGETS_PER_FAMILY: dict[str, int] = {"color": 1, "order": 2, "ground": 1, "badge": 1}


@dataclass(frozen=True)
class NeedleConfig:
    """Every knob of the generator (also the CLI flags: --num-train, --needle-seconds, ...)."""

    num_train: int = 200
    num_eval: int = 50
    duration: float = 64.0  # seconds
    fps: float = 2.0  # fractional rates (2.5, 29.97) are fine
    width: int = 64  # even: yuv420p
    height: int = 64
    needle_seconds: float = 3.0
    needle_size: float = 0.3  # side of a needle, as a fraction of the shorter frame side
    palette: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "orange")
    shapes: tuple[str, ...] = ("square", "circle", "triangle")
    distractors: int = 1  # non-target needles per video
    hint: str = "coarse"  # exact | coarse | none
    coarse_span: int = 2  # the video in halves (2), thirds (3) or quarters (4)
    exact_span: float = 10.0  # seconds of the window an exact hint names
    families: tuple[tuple[str, float], ...] = (("color", 1.0), ("order", 1.0), ("ground", 1.0))
    shuffle_options: bool = True  # False: colour options in palette order (a fixed A-D mapping)
    seed: int = 0

    def __post_init__(self) -> None:
        problems = [message for bad, message in _config_checks(self) if bad]
        if problems:
            raise ValueError("NeedleConfig: " + "; ".join(problems))


def _config_checks(cfg: NeedleConfig) -> list[tuple[bool, str]]:
    weights = dict(cfg.families)
    return [
        (cfg.num_train < 0 or cfg.num_eval < 0, "num_train and num_eval must be >= 0"),
        (not cfg.duration > 0 or not cfg.fps > 0, "duration and fps must be > 0"),
        (cfg.width % 2 or cfg.height % 2, "width and height must be even (yuv420p)"),
        (min(cfg.width, cfg.height) < 16, "width and height must be >= 16"),
        (not 0 < cfg.needle_seconds < cfg.duration, "needle_seconds must be in (0, duration)"),
        (not 0 < cfg.needle_size <= 1, "needle_size must be in (0, 1]"),
        (not set(cfg.palette) <= set(PALETTE), f"palette colours must be among {list(PALETTE)}"),
        (len(set(cfg.palette)) < len(LETTERS), "palette needs >= 4 colours (options A-D)"),
        (not cfg.shapes or not set(cfg.shapes) <= set(SHAPES), f"shapes must be in {list(SHAPES)}"),
        (cfg.distractors < 0, "distractors must be >= 0"),
        (cfg.hint not in HINTS, f"hint must be one of {list(HINTS)}"),
        (cfg.coarse_span not in COARSE_PARTS, f"coarse_span must be one of {list(COARSE_PARTS)}"),
        (not cfg.exact_span > 0, "exact_span must be > 0"),
        (not set(weights) <= set(FAMILIES), f"families must be among {list(FAMILIES)}"),
        (min(weights.values(), default=-1) < 0, "family weights must be >= 0"),
        (sum(weights.values()) <= 0, "family weights must sum to > 0"),
        (
            cfg.distractors > 0 and len(set(cfg.shapes)) < 2 and weights.get("color", 0) > 0,
            "distractors in the color family need >= 2 shapes (or set distractors=0)",
        ),
    ]


@dataclass(frozen=True)
class Needle:
    """One shape on screen in frames [start, stop), top-left corner (x, y), side `size` px."""

    color: str
    shape: str
    start: int
    stop: int
    x: int
    y: int
    size: int
    target: bool

    def window(self, fps: float) -> list[float]:
        return [round(self.start / fps, 2), round(self.stop / fps, 2)]

    def to_row(self, fps: float) -> dict:
        box = [self.x, self.y, self.size]
        return {
            "color": self.color,
            "shape": self.shape,
            "window": self.window(fps),
            "frames": [self.start, self.stop],
            "box": box,
            "target": self.target,
        }


def _kinds(rng: np.random.Generator, family: str, cfg: NeedleConfig) -> list[tuple[str, str, bool]]:
    """(colour, shape, is_target) of every needle: distinct-colour targets, then distractors."""
    palette, shapes = list(dict.fromkeys(cfg.palette)), list(dict.fromkeys(cfg.shapes))
    if family == "badge":
        palette = palette[: detail.SQUARE_COLOURS]
    count = TARGETS_PER_FAMILY[family]
    colours = [palette[i] for i in rng.permutation(len(palette))[:count]]
    targets = [(c, shapes[int(rng.integers(len(shapes)))]) for c in colours]
    # A distractor must not answer the question: in `color` it may not share the asked shape,
    # elsewhere (targets named by colour and shape) it may not be a target's exact kind.
    allowed = [
        (c, s)
        for c in palette
        for s in shapes
        if (s not in {t[1] for t in targets} if family == "color" else (c, s) not in targets)
    ]
    picks = rng.integers(len(allowed), size=cfg.distractors)
    return [(c, s, True) for c, s in targets] + [(*allowed[int(i)], False) for i in picks]


def _place(rng: np.random.Generator, busy: np.ndarray, lo: int, hi: int, length: int) -> int:
    """A random start frame in [lo, hi - length] whose needle keeps a 1-frame gap to the others."""
    starts = [
        s for s in range(lo, hi - length + 1) if not busy[max(s - 1, 0) : s + length + 1].any()
    ]
    if not starts:
        raise ValueError(
            f"cannot fit another {length}-frame needle in frames [{lo}, {hi}); "
            "lower needle_seconds or distractors, or raise duration"
        )
    start = starts[int(rng.integers(len(starts)))]
    busy[start : start + length] = True
    return start


def _plan(cfg: NeedleConfig, split: str, index: int) -> tuple[dict, list[Needle]]:
    """One sample's row and its needles, from its own seed stream (no files touched)."""
    rng = np.random.default_rng([cfg.seed, SPLIT_STREAMS[split], index])
    names, weights = zip(*cfg.families, strict=True)
    family = names[int(rng.choice(len(names), p=np.asarray(weights) / sum(weights)))]
    num_frames = num_video_frames(cfg.duration, cfg.fps)
    length = max(1, round(cfg.needle_seconds * cfg.fps))
    lo_s, hi_s, hint = HINTS[cfg.hint](rng, cfg)
    # Even sizes and corners align needles with yuv420p's 2x2 chroma blocks: no colour bleed.
    size = max(4, 2 * round(cfg.needle_size * min(cfg.width, cfg.height) / 2))
    busy = np.zeros(num_frames, dtype=bool)
    needles = []
    # Targets go inside the hinted span, distractors anywhere in the video.
    inside = (math.ceil(lo_s * cfg.fps - 1e-6), min(math.floor(hi_s * cfg.fps + 1e-6), num_frames))
    for colour, shape, is_target in _kinds(rng, family, cfg):
        start = _place(rng, busy, *(inside if is_target else (0, num_frames)), length)
        slots = [(cfg.width - size) // 2 + 1, (cfg.height - size) // 2 + 1]
        x, y = (2 * int(v) for v in rng.integers(0, slots))
        needles.append(Needle(colour, shape, start, start + length, x, y, size, is_target))
    targets = tuple(n for n in needles if n.target)
    others = tuple(n for n in needles if not n.target)
    badge = detail.BADGES[int(rng.integers(len(detail.BADGES)))] if family == "badge" else ""
    palette = tuple(cfg.palette)
    scene = Scene(targets, others, palette, hint, cfg.fps, cfg.shuffle_options, badge)
    question = FAMILIES[family](rng, scene)
    sample_id = f"needle-{split}-{index:05d}"
    row = {
        "id": sample_id,
        "data_source": "needle",
        "prompt": [{"role": "user", "content": "<video>\n" + question.text}],
        "videos": [{"video": f"videos/{sample_id}.mp4"}],
        "extra_info": {
            "answer": question.answer,
            "question_type": question.question_type,
            "options": list(question.options),
            "windows": [n.window(cfg.fps) for n in targets],
            "family": family,
            "hint": hint,
            "hint_window": [round(lo_s, 2), round(hi_s, 2)],
            "duration": num_frames / cfg.fps,
            "needles": [n.to_row(cfg.fps) for n in needles],
        },
    }
    if badge:
        row["extra_info"] |= {"badge": badge, "zoom_box": list(detail.ZOOM_BOX)}
    return row, needles


def num_video_frames(duration: float, fps: float) -> int:
    """Frames of a generated video: the stated duration rounded to whole frames (at least 1)."""
    return max(1, round(duration * fps))


def make_rows(cfg: NeedleConfig, split: str) -> list[dict]:
    """The rows of one split ("train" | "eval") without writing any video."""
    count = {"train": cfg.num_train, "eval": cfg.num_eval}[split]
    return [_plan(cfg, split, i)[0] for i in range(count)]


def render_frames(
    needles: list[Needle],
    num_frames: int,
    fps: float,
    width: int,
    height: int,
    seed: Sequence[int],
    badge: str = "",
) -> Iterator[np.ndarray]:
    """Frames [H, W, 3] uint8: drifting grey level and gradient, mild noise, needles on top,
    and the corner badge (`badge`: its stripes' direction; "" for none) over everything."""
    rng = np.random.default_rng(list(seed))
    phase = rng.uniform(0, 2 * math.pi)
    columns = np.arange(width) / width
    masks = {n: SHAPES[n.shape](*np.mgrid[: n.size, : n.size], n.size) for n in needles}
    for f in range(num_frames):
        t = f / fps
        row = (
            128
            + 24 * math.sin(2 * math.pi * t / 40 + phase)
            + 12 * np.sin(2 * math.pi * (columns + t / 25))
        )
        # Noise on 4x4 blocks: frames never repeat, yet the encoder spends few bits on it.
        noise = np.kron(rng.normal(0, 2.0, (-(-height // 4), -(-width // 4))), np.ones((4, 4)))
        grey = np.clip(row[None, :] + noise[:height, :width], 0, 255).astype(np.uint8)
        frame = np.repeat(grey[:, :, None], 3, axis=2)
        for n, mask in masks.items():
            if n.start <= f < n.stop:
                frame[n.y : n.y + n.size, n.x : n.x + n.size][mask] = PALETTE[n.color]
        if badge:
            detail.draw_badge(frame, badge)
        yield frame


def generate(cfg: NeedleConfig, out_dir: str | Path) -> dict[str, Path]:
    """Write videos/, train/eval .parquet and .jsonl, and config.json under `out_dir`."""
    out = Path(out_dir)
    written = {"videos": out / "videos"}
    for split, count in (("train", cfg.num_train), ("eval", cfg.num_eval)):
        rows = []
        for index in track(range(count), desc=f"needle {split} videos", every=16):
            row, needles = _plan(cfg, split, index)
            frames = render_frames(
                needles,
                num_video_frames(cfg.duration, cfg.fps),
                cfg.fps,
                cfg.width,
                cfg.height,
                seed=(cfg.seed, SPLIT_STREAMS[split], index, 1),  # the background's own stream
                badge=row["extra_info"].get("badge", ""),
            )
            write_video(out / row["videos"][0]["video"], frames, cfg.fps)
            rows.append(row)
        written[f"{split}.jsonl"] = out / f"{split}.jsonl"
        written[f"{split}.jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
        if _write_parquet(rows, out / f"{split}.parquet"):
            written[f"{split}.parquet"] = out / f"{split}.parquet"
    written["config.json"] = out / "config.json"
    written["config.json"].write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    return written


def needle_data_matches(cfg: NeedleConfig, out_dir: str | Path) -> bool:
    """Whether `out_dir` holds both splits generated from exactly `cfg` (its config.json)."""
    out = Path(out_dir)
    record = out / "config.json"
    if not all((out / f).exists() for f in ("config.json", "train.jsonl", "eval.jsonl")):
        return False
    try:
        saved = json.loads(record.read_text())
    except json.JSONDecodeError:
        return False
    return saved == json.loads(json.dumps(dataclasses.asdict(cfg)))


def ensure_needle_data(cfg: NeedleConfig, out_dir: str | Path) -> bool:
    """Generate the data into `out_dir` unless it was generated from `cfg`; True if (re)written.

    Stale videos of an earlier config are overwritten sample by sample; the .jsonl/.parquet files
    list only the current config's samples, so leftovers are never read.
    """
    if needle_data_matches(cfg, out_dir):
        return False
    generate(cfg, out_dir)
    return True


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _weights(text: str) -> tuple[tuple[str, float], ...]:
    pairs = [part.split("=") for part in _names(text)]
    if any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected name=weight,... (got {text!r})")
    return tuple((name.strip(), float(weight)) for name, weight in pairs)


def _flag(text: str) -> bool:
    """true / false (also 1 / 0, yes / no); anything else is refused, not read as false."""
    value = text.strip().lower()
    if value not in ("1", "true", "yes", "0", "false", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false (got {text!r})")
    return value in ("1", "true", "yes")


_CLI_TYPES: dict[str, Callable[[str], object]] = {
    "palette": _names,
    "shapes": _names,
    "families": _weights,
    "shuffle_options": _flag,
}


def cli_text(value: object) -> str:
    """`value` written as its option takes it: ("red", "blue") -> "red,blue", the families
    (("color", 1.0),) -> "color=1.0", True -> "true" (what `--help` shows as the default)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(
            f"{item[0]}={item[1]}" if isinstance(item, tuple) else str(item) for item in value
        )
    return str(value)


def main(argv: list[str] | None = None) -> int:
    """`paravt make-needle-data --out DIR [--num-train N --num-eval M --duration S ...]`."""
    parser = argparse.ArgumentParser(
        prog="paravt make-needle-data", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="output directory")
    for field in dataclasses.fields(NeedleConfig):
        kind = _CLI_TYPES.get(field.name, type(field.default))
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            type=kind,
            default=field.default,
            help=f"default: {cli_text(field.default)}",
        )
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    try:
        cfg = NeedleConfig(**args)
        written = generate(cfg, out)
    except ValueError as err:
        print(f"make-needle-data: {err}", file=sys.stderr)
        return 2
    print(f"wrote {cfg.num_train} train + {cfg.num_eval} eval samples: {written['train.parquet']}")
    return 0


def _write_parquet(rows: list[dict], path: Path) -> bool:
    """The parquet twin of a split; skipped, with a warning, where pyarrow is not installed (the
    GPU machine's wheel folder, tests/gpu/run.sh, carries none: JSONL is read there)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        logging.getLogger(__name__).warning("pyarrow not installed: %s not written", path)
        return False
    pq.write_table(pa.Table.from_pylist(rows), path)
    return True
