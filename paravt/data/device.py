"""Moving batches that hold paravt's frozen dataclasses to a device, in any Lightning project.

Lightning's default `transfer_batch_to_device` rebuilds a dataclass by assigning its fields, which
a frozen dataclass refuses ("A frozen dataclass was passed to `apply_to_collection`"), even when
it holds no tensor: a DataModule whose batches are `Sample`s, `EvalItem`s or `Trajectory`s fails
on its first batch. `move_batch` rebuilds them with `dataclasses.replace` instead, moving every
tensor inside (lists, tuples and dicts too) and returning objects without one unchanged.

    class MyData(FrozenBatchTransfer, pl.LightningDataModule): ...   # or on the LightningModule

paravt's own modules keep their batches on the host (`RolloutDataModule`, `SFTModule`: the
tensors are built on the policy's device later), so they override the hook to do nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch


def move_batch(batch: Any, device: torch.device | str) -> Any:
    """`batch` with every tensor on `device`; frozen dataclasses are rebuilt, not assigned.

    A container or dataclass without a tensor inside comes back as the same object."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        names = [f.name for f in dataclasses.fields(batch) if f.init]
        moved = {k: move_batch(getattr(batch, k), device) for k in names}
        if all(moved[k] is getattr(batch, k) for k in names):
            return batch  # no __post_init__ rerun for nothing
        return dataclasses.replace(batch, **moved)
    if isinstance(batch, Mapping):
        items = {k: move_batch(v, device) for k, v in batch.items()}
        same = all(items[k] is v for k, v in batch.items())
        return batch if same else type(batch)(items)
    if isinstance(batch, list | tuple):
        values = [move_batch(v, device) for v in batch]
        if all(a is b for a, b in zip(values, batch, strict=True)):
            return batch
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple
            return type(batch)(*values)
        return type(batch)(values)
    return batch


class FrozenBatchTransfer:
    """Mixin for a LightningDataModule or LightningModule whose batches hold frozen dataclasses."""

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int):
        return move_batch(batch, device)
