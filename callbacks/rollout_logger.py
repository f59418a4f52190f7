"""Write a few training rollouts to the trackers: full text, turn by turn, and a crop timeline.

Every `every_n_steps` optimizer steps, `RolloutLogger` takes `pl_module.last_rollout` and writes,
at the record's own `step`,
- `rollouts/trajectory_{i}` (text, markdown): the i-th picked rollout (best, worst, second best,
  ... by total reward), each turn's own text, its parsed calls, the tool results or errors, and
  the reward breakdown;
- `rollouts/crop_timeline` (image): for the prompt of the best rollout, one row per rollout of
  its group with the windows it cropped drawn as bars on the video's timeline (seconds, with
  ticks), over the shaded ground-truth windows; each row labelled with its reward and answer,
  the title naming the sample, the step and the frame budget K (`paravt.callbacks.crop_figure`).
  With `png_path`, the last one is also saved there as a PNG when training ends.
Texts and the image reach every logger that holds them (TensorBoard, W&B, MLflow:
`paravt.callbacks.tracker_io`); with none (CSV only, or no logger) it warns once and does nothing.
matplotlib is not a dependency: the bars are drawn with numpy by the pure `draw_crop_timeline`,
the labels with Pillow. This module deliberately logs no scalars (the module and other callbacks
do) and writes only on global rank 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.utilities import rank_zero_warn

from paravt.callbacks.crop_figure import PLOT_WIDTH, ROW_HEIGHT, timeline_figure
from paravt.callbacks.records import RolloutRecord, latest_rollout
from paravt.callbacks.schedules import crossed_multiple
from paravt.callbacks.tracker_io import TrackerWriter
from paravt.rewards.accuracy import extract_answer
from paravt.types import RewardBreakdown, Trajectory, Turn

BACKGROUND = (255, 255, 255)
TRUTH = (198, 232, 198)  # light green shading behind the bars
# Successive crops of one rollout alternate colours so that adjacent windows stay distinct.
CROPS = ((31, 119, 180), (255, 127, 14))

Window = tuple[float, float]


def _column(t: float, duration: float, width: int) -> int:
    """Pixel column of time `t`: round half up of t / duration * width, clamped to [0, width]."""
    return min(max(math.floor(t / duration * width + 0.5), 0), width)


def _span(window: Window, duration: float, width: int) -> tuple[int, int]:
    """Columns [x0, x1) of a window; at least one pixel wide so that tiny crops stay visible."""
    start, end = sorted(window)
    x0 = min(_column(start, duration, width), width - 1)
    return x0, max(_column(end, duration, width), x0 + 1)


def draw_crop_timeline(
    rows: Sequence[Sequence[Window]],
    truth: Sequence[Window],
    duration: float,
    width: int = 480,
    row_height: int = 16,
) -> np.ndarray:  # [H, W, 3] uint8, H = max(1, len(rows)) * row_height
    """Crop windows (seconds) as bars, one row per rollout, over shaded ground-truth windows.

    Time t maps to column round(t / duration * width). Truth windows shade the full height; the
    bars of row r cover pixel rows [r * row_height + pad, (r + 1) * row_height - pad) with
    pad = row_height // 4, and alternate between the two `CROPS` colours.
    """
    if not (math.isfinite(duration) and duration > 0):
        raise ValueError(f"duration must be a positive number of seconds, got {duration!r}")
    if width < 1 or row_height < 1:
        raise ValueError(f"width and row_height must be >= 1, got {width} and {row_height}")
    height = max(1, len(rows)) * row_height
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    for window in truth:
        x0, x1 = _span(window, duration, width)
        image[:, x0:x1] = TRUTH
    pad = row_height // 4
    for r, windows in enumerate(rows):
        top, bottom = r * row_height + pad, (r + 1) * row_height - pad
        for i, window in enumerate(windows):
            x0, x1 = _span(window, duration, width)
            image[top:bottom, x0:x1] = CROPS[i % len(CROPS)]
    return image


def crop_windows(trajectory: Trajectory) -> list[Window]:
    """The windows actually cropped (clamped) by the successful tool results, in order."""
    return [
        result.window
        for turn in trajectory.turns
        for result in turn.results
        if result.ok and result.window is not None
    ]


def pick_trajectories(totals: Sequence[float], k: int) -> list[int]:
    """Indices of k rollouts alternating best, worst, second best, ... (ties: lower index)."""
    order = sorted(range(len(totals)), key=lambda n: (-totals[n], n))
    picks: list[int] = []
    low, high = 0, len(order) - 1
    while low <= high and len(picks) < k:
        picks.append(order[low] if len(picks) % 2 == 0 else order[high])
        low, high = (low + 1, high) if len(picks) % 2 == 1 else (low, high - 1)
    return picks


def _code(text: str) -> str:
    # Indented code keeps the model's own markup (tags, backticks) literal in TensorBoard.
    return "\n".join("    " + line for line in (text or "(empty)").splitlines())


def _calls_markdown(turn: Turn) -> list[str]:
    lines = []
    for call in turn.calls:
        if call.ok and call.call is not None:
            args = json.dumps(dict(call.call.arguments), default=str)
            lines.append(f"- call {call.index}: `{call.call.name}` {args}")
        else:
            lines.append(f"- call {call.index}: INVALID ({call.error}): {call.raw!r}")
    for result in turn.results:
        if result.ok and result.frames is not None:
            start, end = result.window or (float("nan"), float("nan"))
            frames = len(result.frames.indices)
            lines.append(f"- result {result.index}: [{start:.1f}, {end:.1f}] s, {frames} frames")
            if result.summary:
                lines.append(f"  summary: {result.summary!r}")
        else:
            lines.append(f"- result {result.index}: ERROR {result.error}")
    return lines


def _reward_markdown(reward: RewardBreakdown) -> str:
    head = (
        f"reward {reward.total:.3f} = accuracy {reward.accuracy:.3f}, format "
        f"{reward.format:.3f}, tool {reward.tool:.3f}"
        + (" (DEGENERATE)" if reward.degenerate else "")
    )
    parts = ", ".join(f"{name} {value:.3f}" for name, value in reward.components.items())
    return f"{head}\n\ncomponents: {parts}" if parts else head


def format_trajectory(trajectory: Trajectory, reward: RewardBreakdown, title: str) -> str:
    """A markdown rendering of one rollout: header, reward, then every turn with its tools."""
    t = trajectory
    stats = (
        f"calls {t.num_calls} (valid {t.num_valid_calls}), tool responses "
        f"{t.num_tool_responses}, rounds {t.num_rounds}, finish {t.finish_reason}"
        + (", TRUNCATED" if t.truncated else "")
    )
    blocks = [f"### {title}", _reward_markdown(reward), stats]
    for i, turn in enumerate(t.turns, start=1):
        blocks.append(f"**turn {i}**" + (" (forced answer)" if turn.forced_answer else ""))
        blocks.append(_code(turn.text))
        calls = _calls_markdown(turn)
        if calls:
            blocks.append("\n".join(calls))
    return "\n\n".join(blocks)


def _timeline_span(
    duration: float, rows: Sequence[Sequence[Window]], truth: Sequence[Window]
) -> float:
    """The video duration, or the last window end when the duration is unknown (<= 0)."""
    if math.isfinite(duration) and duration > 0:
        return duration
    ends = [max(w) for windows in (*rows, truth) for w in windows]
    return max([e for e in ends if math.isfinite(e) and e > 0], default=1.0)


class RolloutLogger(pl.Callback):
    """Every `every_n_steps` steps, write `num_trajectories` rollouts and a crop timeline."""

    def __init__(
        self, every_n_steps: int = 10, num_trajectories: int = 2, png_path: str | None = None
    ) -> None:
        for name, value in (
            ("every_n_steps", every_n_steps),
            ("num_trajectories", num_trajectories),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RolloutLogger.{name} must be an int >= 1, got {value!r}")
        self.every_n_steps = every_n_steps
        self.num_trajectories = num_trajectories
        self._last_step = 0  # nothing to log before the first optimizer step
        self._warned = False
        self.last_figure: np.ndarray | None = None  # [H, W, 3] the latest crop timeline
        self.png_path = png_path

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        if (
            not crossed_multiple(step, self._last_step, self.every_n_steps)
            or not trainer.is_global_zero
        ):
            return
        record = latest_rollout(pl_module, type(self).__name__)
        writer = self._writer(trainer)
        if record is None or not record.trajectories or writer is None:
            return
        self._last_step = step
        # At record.step, the step the module stamped on these rollouts, so that the text sits
        # beside the scalars the module logged for the same batch.
        self.write(writer, record, record.step)

    def _writer(self, trainer: pl.Trainer) -> Any:
        writer = TrackerWriter(trainer.loggers)
        if writer:
            return writer
        if not self._warned:
            self._warned = True
            rank_zero_warn(
                "RolloutLogger writes text and images through a logger that holds them "
                "(logger=tensorboard, wandb or mlflow), and the trainer has none; add one or "
                "drop RolloutLogger. Skipping rollout logging."
            )
        return None

    def write(self, writer: Any, record: RolloutRecord, step: int) -> None:
        """Write the picked rollouts' text and the crop timeline of the best one's group."""
        size = record.group_size
        picks = pick_trajectories([r.total for r in record.rewards], self.num_trajectories)
        for i, n in enumerate(picks):
            b, g = divmod(n, size)
            traj = record.trajectories[n]
            title = (
                f"sample `{traj.sample_id}` · prompt {b} · rollout {g} · K = {record.budgets[b]} "
                f"· step {step}"
            )
            text = format_trajectory(traj, record.rewards[n], title)
            writer.add_text(f"rollouts/trajectory_{i}", text, global_step=step)
        image = self.timeline(record, picks[0] // size, step)
        self.last_figure = image
        writer.add_image("rollouts/crop_timeline", image, global_step=step, dataformats="HWC")

    def timeline(self, record: RolloutRecord, b: int, step: int) -> np.ndarray:
        """The labelled crop-timeline figure of prompt `b`'s group."""
        group = record.group(b)
        rows = [crop_windows(t) for t in group]
        span = _timeline_span(record.durations[b], rows, record.windows[b])
        bars = draw_crop_timeline(rows, record.windows[b], span, PLOT_WIDTH, ROW_HEIGHT)
        rewards = record.rewards[b * record.group_size : (b + 1) * record.group_size]
        labels = [_row_label(g, t, r) for g, (t, r) in enumerate(zip(group, rewards, strict=True))]
        title = (
            f"sample {group[0].sample_id} | step {step} | frame budget K = {record.budgets[b]} "
            f"| video {span:g} s"
        )
        legend = "green: truth window   bars: cropped windows (alternating colours per call)"
        return timeline_figure(bars, span, labels, title, legend)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.png_path and self.last_figure is not None and trainer.is_global_zero:
            from PIL import Image

            out = Path(self.png_path)
            out.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(self.last_figure).save(out)


def _row_label(g: int, trajectory: Trajectory, reward: RewardBreakdown) -> str:
    """`#2 r=0.85 ans: B` (the answer cut to 18 characters, `-` when there is none)."""
    answer = " ".join(extract_answer(trajectory.response_text).split()) or "-"
    if len(answer) > 18:
        answer = answer[:17] + "…"
    return f"#{g} r={reward.total:.2f} ans: {answer}"
