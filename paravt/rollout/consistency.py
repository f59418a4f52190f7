"""Rollout / trainer consistency: does a trajectory's token sequence match its vision inputs?

The trainer scores a trajectory by one teacher-forced pass over `token_ids` with `visuals`. If
the two disagree (a tool clip dropped from a later turn, a stray placeholder token, M-RoPE
positions that differ from the engine's, frames labelled with the wrong times) the forward either
fails deep inside the model or, worse, silently scores other inputs than the engine sampled
from. `check_trajectory` compares, per turn (turn 0: the overview prompt, turn k: the tool
results of assistant turn k):
- clips: every successful crop (and the overview) has its `Visual`, with `pixel_values_videos`
  whose rows match its grid;
- placeholders: the runs of video placeholder tokens equal the runs its grid fills (Qwen3-VL:
  one run per temporal patch; Qwen2.5-VL: one run per clip);
- timestamps: each crop's frames lie in the window the call asked for and, where the processor
  writes time labels into the text (Qwen3-VL's `<t seconds>`), each label is its patch's mean
  frame time;
- positions: the trainer's M-RoPE positions of the whole sequence equal the engine's for each
  turn's context: those the engine reports, else the positions recomputed from that turn's
  prefix alone (what an engine that re-encodes each round computes).
It returns `Mismatch`es; what to do with them (raise, drop) is `apply_policy`'s. Only the main
trajectory is checked (sub-agent rollouts are not trained by default). It runs no model: the
position function and the tokenizer's decode come in as callables.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from paravt.types import Frames, Trajectory

log = logging.getLogger(__name__)
MODES = ("error", "warn", "off")
RopeIndex = Callable[..., torch.Tensor]  # (ids [1, L], types [1, L], grid, secs) -> [3, 1, L]
_LABEL = re.compile(r"<(\d+(?:\.\d+)?) seconds>\s*$")
_LABEL_TOKENS = 12  # a "<12.5 seconds>" label plus <|vision_start|> fits in this many tokens


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"rollout.consistency must be one of {MODES}, got {mode!r}")


@dataclass(frozen=True)
class VisionSpec:
    """What the check needs to know of the processor: ids and the vision grid's layout."""

    video_id: int
    image_id: int
    merge_size: int = 2
    temporal_patch_size: int = 2
    run_per_frame: bool = True  # Qwen3-VL: one placeholder run per temporal patch

    @classmethod
    def from_processor(cls, processor) -> VisionSpec:
        tok, video = processor.tokenizer, processor.video_processor
        return cls(
            video_id=tok.convert_tokens_to_ids("<|video_pad|>"),
            image_id=tok.convert_tokens_to_ids("<|image_pad|>"),
            merge_size=int(video.merge_size),
            temporal_patch_size=int(video.temporal_patch_size),
            run_per_frame=type(processor).__name__.startswith("Qwen3VL"),
        )


@dataclass(frozen=True)
class Mismatch:
    """One disagreement, located by trajectory, turn (0: the prompt) and tool result."""

    trajectory: str
    turn: int
    kind: str  # clips | placeholders | timestamps | positions
    detail: str
    result: int | None = None

    def __str__(self) -> str:
        where = "prompt (overview)" if self.turn == 0 else f"turn {self.turn}"
        if self.result is not None:
            where += f", tool result {self.result}"
        return f"trajectory {self.trajectory}, {where}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class _Slot:
    """Where a clip is expected: its turn, tool result index, requested window and frames."""

    turn: int
    result: int | None
    window: tuple[float, float] | None
    frames: Frames | None


def trajectory_name(traj: Trajectory) -> str:
    return f"{traj.sample_id}#{traj.group_index}"


def expected_slots(traj: Trajectory) -> list[_Slot]:
    """The overview, then every crop whose frames went into the context, in order."""
    if not traj.visuals:
        return []
    slots = [_Slot(0, None, None, traj.visuals[0].frames)]
    for k, turn in enumerate(traj.turns, start=1):
        shown = [r for r in turn.results if r.ok and r.frames is not None and r.summary is None]
        slots += [_Slot(k, r.index, r.window, r.frames) for r in shown]
    # A turn whose responses would pass max_total_tokens is not appended (truncated).
    last = traj.turns[-1] if traj.turns else None
    cut = [s for s in slots if last is not None and s.turn == len(traj.turns)]
    if traj.truncated and cut and len(traj.visuals) == len(slots) - len(cut):
        slots = slots[: -len(cut)]
    return slots


def _same_clip(frames: Frames | None, other: Frames | None) -> bool:
    if frames is None or other is None:
        return frames is other
    return frames.indices == other.indices and frames.timestamps == other.timestamps


def match_clips(traj: Trajectory, slots: Sequence[_Slot]) -> tuple[list[int], list[Mismatch]]:
    """Slot index of every visual, and a mismatch for every clip without its vision inputs."""
    name, owner, out, j = trajectory_name(traj), [], [], 0
    for i, slot in enumerate(slots):
        visual = traj.visuals[j] if j < len(traj.visuals) else None
        if visual is None or not _same_clip(visual.frames, slot.frames):
            have = f"{len(traj.visuals)} visual inputs for {len(slots)} clips"
            out.append(
                Mismatch(name, slot.turn, "clips", f"no vision inputs ({have})", slot.result)
            )
            continue
        pixels, grid = visual.pixel_values_videos, visual.video_grid_thw
        rows = int(grid.prod()) if grid is not None else -1
        if pixels is None or pixels.shape[0] != rows:
            got = "missing" if pixels is None else f"{pixels.shape[0]} rows"
            detail = f"pixel_values_videos {got}, its grid needs {rows}"
            out.append(Mismatch(name, slot.turn, "clips", detail, slot.result))
        owner.append(i)
        j += 1
    for extra in traj.visuals[j:]:
        detail = f"a visual input no turn accounts for (grid {extra.video_grid_thw.tolist()})"
        out.append(Mismatch(name, slots[-1].turn if slots else 0, "clips", detail))
    return owner, out


def placeholder_runs(ids: torch.Tensor, token: int) -> list[tuple[int, int]]:
    """(start, length) of every maximal run of `token` in `ids` [L]."""
    hit = (ids == token).to(torch.int8)
    edges = torch.diff(hit, prepend=hit.new_zeros(1), append=hit.new_zeros(1))
    starts = torch.nonzero(edges == 1).flatten().tolist()
    ends = torch.nonzero(edges == -1).flatten().tolist()
    return [(s, e - s) for s, e in zip(starts, ends, strict=True)]


def expected_runs(grid: torch.Tensor, spec: VisionSpec) -> list[int]:
    """Placeholder run lengths one clip's features fill: [h*w/m^2] * t, or [t*h*w/m^2]."""
    t, h, w = (int(x) for x in grid.flatten().tolist())
    per_frame = h * w // (spec.merge_size**2)
    return [per_frame] * t if spec.run_per_frame else [t * per_frame]


def turn_at(loss_mask: Sequence[int], pos: int) -> int:
    """The context turn token `pos` belongs to: 0 before the first sampled turn, k after the
    k-th (the tool results of assistant turn k come right after it)."""
    mask = torch.tensor(loss_mask[:pos], dtype=torch.int8)
    if mask.numel() == 0:
        return 0
    starts = torch.diff(mask, prepend=mask.new_zeros(1)) == 1
    return int(starts.sum())


def check_placeholders(
    traj: Trajectory, slots: Sequence[_Slot], owner: Sequence[int], ids: torch.Tensor, spec
) -> tuple[list[Mismatch], list[list[tuple[int, int]]]]:
    """Placeholder runs vs the runs each visual's grid fills, and the runs of every visual."""
    name, runs = trajectory_name(traj), placeholder_runs(ids, spec.video_id)
    spans: list[list[tuple[int, int]]] = []
    at = 0
    for v, visual in enumerate(traj.visuals):
        want = expected_runs(visual.video_grid_thw, spec)
        got = runs[at : at + len(want)]
        if [n for _, n in got] != want:
            if v < len(owner):
                turn, result = slots[owner[v]].turn, slots[owner[v]].result
            else:  # a visual no clip accounts for (match_clips names it)
                turn, result = turn_at(traj.loss_mask, got[0][0] if got else len(ids)), None
            detail = (
                f"{sum(n for _, n in got)} video placeholder tokens in {len(got)} run(s) "
                f"{[n for _, n in got]} where its features fill {sum(want)} in {want}"
            )
            return [Mismatch(name, turn, "placeholders", detail, result)], spans
        spans.append(got)
        at += len(want)
    out = []
    if at < len(runs):
        extra = runs[at:]
        detail = (
            f"{sum(n for _, n in extra)} video placeholder tokens at position {extra[0][0]} "
            f"that no clip's features fill"
        )
        out.append(Mismatch(name, turn_at(traj.loss_mask, extra[0][0]), "placeholders", detail))
    images = int((ids == spec.image_id).sum())
    if images:
        detail = f"{images} image placeholder tokens but no image inputs"
        out.append(Mismatch(name, 0, "placeholders", detail))
    return out, spans


def check_timestamps(
    traj: Trajectory,
    slots: Sequence[_Slot],
    owner: Sequence[int],
    spans: Sequence[Sequence[tuple[int, int]]],
    spec: VisionSpec,
    decode: Callable[[list[int]], str] | None,
) -> list[Mismatch]:
    """Crop frames inside the requested window; each written time label == its patch's time."""
    name, out = trajectory_name(traj), []
    for v, visual in enumerate(traj.visuals):
        slot, frames = slots[owner[v]], visual.frames
        if frames is None or not frames.timestamps:
            continue
        times = frames.timestamps
        if slot.window is not None:
            lo, hi, slack = *slot.window, 1.0 / max(frames.fps, 1e-6)
            if min(times) < lo - slack or max(times) > hi + slack:
                detail = (
                    f"frames at {min(times):g}-{max(times):g} s are outside the requested "
                    f"window {lo:g}-{hi:g} s"
                )
                out.append(Mismatch(name, slot.turn, "timestamps", detail, slot.result))
        if decode is None or not spec.run_per_frame:
            continue
        for p, (start, _) in enumerate(spans[v]):
            patch = times[p * spec.temporal_patch_size : (p + 1) * spec.temporal_patch_size]
            want = sum(patch) / len(patch)
            text = decode(list(traj.token_ids[max(0, start - _LABEL_TOKENS) : start]))
            found = _LABEL.search(text.replace("<|vision_start|>", ""))
            label = float(found.group(1)) if found else None
            if label is None or abs(label - want) > 0.051:  # labels are written with 1 decimal
                told = "no time label" if label is None else f"{label:g} s"
                detail = f"the model is told {told} for frames at {want:.2f} s (patch {p})"
                if slot.window is not None:
                    detail += f", requested window {slot.window[0]:g}-{slot.window[1]:g} s"
                out.append(Mismatch(name, slot.turn, "timestamps", detail, slot.result))
                break
    return out


def _rope(rope: RopeIndex, traj: Trajectory, ids: torch.Tensor, n_visuals: int, spec):
    visuals = traj.visuals[:n_visuals]
    grid = torch.cat([v.video_grid_thw for v in visuals]) if visuals else None
    secs = None
    if visuals and all(v.second_per_grid_ts is not None for v in visuals):
        secs = torch.tensor([v.second_per_grid_ts for v in visuals])
    types = (ids == spec.image_id).long() + 2 * (ids == spec.video_id).long()
    return rope(ids[None], types[None], grid, secs)[:, 0]  # [3, L]


def check_positions(
    traj: Trajectory,
    rope: RopeIndex,
    ids: torch.Tensor,
    spans: Sequence[Sequence[tuple[int, int]]],
    spec: VisionSpec,
    engine_positions: Sequence[torch.Tensor] | None = None,
) -> list[Mismatch]:
    """The trainer's positions of the whole sequence vs the engine's of each turn's context
    (`engine_positions[k]` [3, L_k] where the engine reports them, else recomputed from the
    k-th context alone)."""
    full = _rope(rope, traj, ids, len(traj.visuals), spec)
    mask = torch.tensor(traj.loss_mask, dtype=torch.int8)
    starts = torch.nonzero(torch.diff(mask, prepend=mask.new_zeros(1)) == 1).flatten().tolist()
    for k, end in enumerate(starts):
        if engine_positions is not None and k < len(engine_positions):
            engine = engine_positions[k]
        else:
            shown = sum(1 for runs in spans if runs and runs[0][0] < end)
            engine = _rope(rope, traj, ids[:end], shown, spec)
        differ = torch.nonzero((engine[:, :end] != full[:, :end]).any(0)).flatten()
        if differ.numel():
            t = int(differ[0])
            detail = (
                f"M-RoPE position of token {t} is {full[:, t].tolist()} for the trainer and "
                f"{engine[:, t].tolist()} for the engine's context of assistant turn {k + 1}"
            )
            return [
                Mismatch(trajectory_name(traj), turn_at(traj.loss_mask, t), "positions", detail)
            ]
    return []


def check_trajectory(
    traj: Trajectory,
    spec: VisionSpec,
    rope: RopeIndex | None = None,
    decode: Callable[[list[int]], str] | None = None,
    engine_positions: Sequence[torch.Tensor] | None = None,
) -> list[Mismatch]:
    """Every mismatch of `traj` (empty: consistent). Positions are compared only when the
    placeholders agree (the position function cannot read a grid its tokens contradict)."""
    if not traj.token_ids:
        return []
    slots = expected_slots(traj)
    owner, out = match_clips(traj, slots)
    ids = torch.tensor(traj.token_ids, dtype=torch.long)
    placeholders, spans = check_placeholders(traj, slots, owner, ids, spec)
    out += placeholders
    if out:
        return out
    out += check_timestamps(traj, slots, owner, spans, spec, decode)
    if rope is not None:
        out += check_positions(traj, rope, ids, spans, spec, engine_positions)
    return out


class ConsistencyError(RuntimeError):
    """A trajectory whose tokens and vision inputs disagree (rollout.consistency=error)."""


def drop_from_loss(traj: Trajectory) -> Trajectory:
    """The trajectory with no trained token: its reward still counts in its group, its
    log-probs (scored on inputs the engine did not see) never reach the loss."""
    n = len(traj.token_ids)
    return replace(traj, loss_mask=(0,) * n, logprobs=(0.0,) * n)


def apply_policy(
    trajs: Sequence[Trajectory], found: Sequence[Sequence[Mismatch]], mode: str, step: int
) -> tuple[list[Trajectory], dict[str, float]]:
    """`error`: raise naming every mismatch; `warn`: log them and drop those trajectories from
    the loss. Returns the trajectories and the step's `consistency/*` counts."""
    check_mode(mode)
    bad = [m for ms in found for m in ms]
    if bad and mode == "error":
        lines = "\n  ".join(str(m) for m in bad[:10])
        raise ConsistencyError(
            f"step {step}: {len(bad)} rollout/trainer mismatch(es); the trainer would score "
            f"other inputs than the engine sampled from:\n  {lines}\n(rollout.consistency=warn "
            "drops such trajectories from the loss instead; =off skips the check)"
        )
    for m in bad:
        log.warning("step %d: %s; the trajectory is dropped from the loss", step, m)
    out = [drop_from_loss(t) if ms else t for t, ms in zip(trajs, found, strict=True)]
    counts = {
        "consistency/mismatches": float(len(bad)),
        "consistency/dropped": float(sum(1 for ms in found if ms)),
    }
    return out, counts
