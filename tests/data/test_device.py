"""move_batch / FrozenBatchTransfer: paravt's frozen dataclasses through Lightning's device hook."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from lightning.pytorch.utilities import move_data_to_device

from paravt.data.device import FrozenBatchTransfer
from paravt.eval.adapters.base import EvalItem
from paravt.types import Sample


@dataclasses.dataclass(frozen=True)
class Scored:
    sample: Sample
    scores: torch.Tensor


def _batch():
    sample = Sample("a", "v.mp4", "Which colour?", "B")
    return {"items": [EvalItem(sample)], "scored": (Scored(sample, torch.ones(2)),)}


def test_lightnings_default_refuses_a_frozen_dataclass():
    with pytest.raises(ValueError, match="frozen dataclass"):
        move_data_to_device(_batch(), torch.device("meta"))


def test_move_batch_moves_tensors_inside_frozen_dataclasses():
    batch = _batch()
    moved = FrozenBatchTransfer().transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert moved["scored"][0].scores.device.type == "meta"  # moved, inside a frozen dataclass
    assert batch["scored"][0].scores.device.type == "cpu"  # the original is untouched
    assert moved["items"][0] is batch["items"][0]  # nothing to move: the same object
    assert moved["scored"][0].sample is batch["items"][0].sample
    assert isinstance(moved["scored"], tuple) and isinstance(moved["items"], list)
