"""Model inputs for SFT batches: right-padded rows, or several examples packed into one row.

Packing concatenates examples along the token axis. Each example keeps its own multimodal
positions: M-RoPE ids come from the model's `get_rope_index` run on the example alone, and are
concatenated, so an example sees exactly the positions it would see unpacked. Attention never
crosses examples: the text-position row (row 0 of the 4-row position ids Qwen-VL accepts)
restarts at 0 for every example, and with no 2-D attention mask transformers builds a
block-diagonal causal mask from those restarts (`find_packed_sequence_indices`) for eager and
sdpa attention alike (flash-attention uses the same restarts). Row padding is one more "example"
that nothing attends to and nothing trains on. A test checks that a packed batch gives the same
per-example losses as the examples run one by one.

It deliberately knows nothing of files, rows or losses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from paravt.data.sft_encode import SFTExample
from paravt.models.qwen_vl import mm_token_type_ids
from paravt.types import Visual

# (input_ids [1, T], mm_token_type_ids [1, T], video_grid_thw [V, 3] | None,
#  second_per_grid_ts [V] | None) -> M-RoPE position ids [3, 1, T]
RopeIndex = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class ModelBatch:
    """Tensors of one forward pass over R rows of width T."""

    input_ids: torch.Tensor  # [R, T]
    attention_mask: torch.Tensor | None  # [R, T]; None when packed (positions mark boundaries)
    position_ids: torch.Tensor | None  # [4, R, T] text + M-RoPE rows when packed, else None
    mm_token_type_ids: torch.Tensor  # [R, T]
    loss_mask: torch.Tensor  # [R, T] bool
    answer_mask: torch.Tensor  # [R, T] bool
    example_ids: torch.Tensor  # [R, T] long: index of the token's example, -1 on padding
    visuals: tuple[Visual, ...]  # every clip, in the order its tokens appear (row-major)

    @property
    def num_tokens(self) -> int:
        return int((self.example_ids >= 0).sum())


def plan_packs(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Greedy first-fit of examples (in order) into rows of at most `max_tokens` tokens.

    An example longer than `max_tokens` gets a row of its own.
    """
    rows: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        slot = next((r for r, free in enumerate(room) if free >= n), None)
        if slot is None:
            rows.append([i])
            room.append(max_tokens - n)
        else:
            rows[slot].append(i)
            room[slot] -= n
    return rows


def _rows_tensors(examples, rows, width: int, pad_id: int):
    r = len(rows)
    ids = torch.full((r, width), pad_id, dtype=torch.long)
    loss = torch.zeros((r, width), dtype=torch.bool)
    answer = torch.zeros((r, width), dtype=torch.bool)
    owner = torch.full((r, width), -1, dtype=torch.long)
    for row, members in enumerate(rows):
        at = 0
        for i in members:
            t = examples[i].trajectory
            n = len(t.token_ids)
            ids[row, at : at + n] = torch.tensor(t.token_ids)
            loss[row, at : at + n] = torch.tensor(t.loss_mask, dtype=torch.bool)
            answer[row, at : at + n] = torch.tensor(examples[i].answer_mask, dtype=torch.bool)
            owner[row, at : at + n] = i
            at += n
    return ids, loss, answer, owner


def _visuals(examples, rows) -> tuple[Visual, ...]:
    return tuple(v for members in rows for i in members for v in examples[i].trajectory.visuals)


def pad_batch(examples: Sequence[SFTExample], pad_id: int, image_id: int, video_id: int):
    """One right-padded row per example; the model computes its own positions."""
    rows = [[i] for i in range(len(examples))]
    width = max(e.num_tokens for e in examples)
    ids, loss, answer, owner = _rows_tensors(examples, rows, width, pad_id)
    return ModelBatch(
        input_ids=ids,
        attention_mask=(owner >= 0).long(),
        position_ids=None,
        mm_token_type_ids=mm_token_type_ids(ids, image_id, video_id),
        loss_mask=loss,
        answer_mask=answer,
        example_ids=owner,
        visuals=_visuals(examples, rows),
    )


def example_positions(example: SFTExample, rope_index: RopeIndex, image_id: int, video_id: int):
    """[4, L] positions of one example alone: text positions 0..L-1, then its M-RoPE rows."""
    t = example.trajectory
    ids = torch.tensor([t.token_ids])
    grid = torch.cat([v.video_grid_thw for v in t.visuals]) if t.visuals else None
    secs = None
    if t.visuals and all(v.second_per_grid_ts is not None for v in t.visuals):
        secs = torch.tensor([v.second_per_grid_ts for v in t.visuals])
    mrope = rope_index(ids, mm_token_type_ids(ids, image_id, video_id), grid, secs)  # [3, 1, L]
    text = torch.arange(ids.shape[1]).view(1, -1)
    return torch.cat([text, mrope[:, 0].to(text.dtype)], dim=0)


def pack_batch(
    examples: Sequence[SFTExample],
    rope_index: RopeIndex,
    max_tokens: int,
    pad_id: int,
    image_id: int,
    video_id: int,
) -> ModelBatch:
    """Examples packed into rows of at most `max_tokens`, with per-example positions."""
    rows = plan_packs([e.num_tokens for e in examples], max_tokens)
    width = max(sum(examples[i].num_tokens for i in members) for members in rows)
    ids, loss, answer, owner = _rows_tensors(examples, rows, width, pad_id)
    pos = torch.zeros((4, len(rows), width), dtype=torch.long)
    for row, members in enumerate(rows):
        at = 0
        for i in members:
            p = example_positions(examples[i], rope_index, image_id, video_id)  # [4, L]
            pos[:, row, at : at + p.shape[1]] = p
            at += p.shape[1]
        pos[:, row, at:] = torch.arange(width - at)  # padding: a separate, untrained sequence
    return ModelBatch(
        input_ids=ids,
        attention_mask=None,
        position_ids=pos,
        mm_token_type_ids=mm_token_type_ids(ids, image_id, video_id),
        loss_mask=loss,
        answer_mask=answer,
        example_ids=owner,
        visuals=_visuals(examples, rows),
    )


def model_rope_index(model) -> RopeIndex:
    """The `RopeIndex` of a transformers Qwen-VL model (Qwen3-VL and Qwen2.5-VL)."""
    inner = getattr(model, "model", model)

    def rope(ids, types, grid, secs):
        kwargs = {"second_per_grid_ts": secs} if secs is not None else {}
        device = next(model.parameters()).device
        grid = None if grid is None else grid.to(device)
        out, _ = inner.get_rope_index(
            input_ids=ids.to(device),
            mm_token_type_ids=types.to(device),
            video_grid_thw=grid,
            **kwargs,
        )
        return out.cpu()

    return rope
