"""Weights from the trainer's process to a generator process: one shared copy plus a version.

`SharedWeights.create` copies a model's state into tensors in shared memory (CPU) once; after
each update the trainer `publish`es the trainable parameters into them in place and bumps the
version; the generator `load_into`s its own model when the version moved. A lock keeps a reader
from seeing half an update. The object pickles into a `torch.multiprocessing` spawn child (the
tensors travel as shared-memory handles, not copies).

GPU (NOT verified: no GPU was available): the same class with `device="cuda"` keeps the buffers
on the trainer's GPU, and torch.multiprocessing passes them to the child as CUDA IPC handles, so
`load_into` is a device-to-device copy (same node). Across nodes, or for an FSDP-sharded
trainer, a torch.distributed (NCCL) broadcast of the gathered buckets
(`paravt.parallel.distributed.iter_full_state_dict`) would publish instead; it is not implemented.
"""

from __future__ import annotations

import torch


class SharedWeights:
    """A shared state dict, the version it holds, and the lock that guards both."""

    def __init__(self, tensors: dict[str, torch.Tensor], trainable: tuple[str, ...], value, lock):
        self.tensors, self.trainable, self._value, self._lock = tensors, trainable, value, lock

    @classmethod
    def create(cls, model, version: int, ctx, device: str = "cpu") -> SharedWeights:
        state = model.state_dict()
        tensors = {k: v.detach().to(device).clone().share_memory_() for k, v in state.items()}
        trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
        return cls(tensors, trainable, ctx.Value("q", version), ctx.Lock())

    @property
    def version(self) -> int:
        return int(self._value.value)

    @torch.no_grad()
    def publish(self, model, version: int) -> None:
        """Copy `model`'s trainable parameters in and mark them `version`."""
        params = dict(model.named_parameters())
        with self._lock:
            for name in self.trainable:
                self.tensors[name].copy_(params[name].detach())
            self._value.value = version

    @torch.no_grad()
    def load_into(self, model, everything: bool = False) -> int:
        """Copy the shared weights into `model` (trainable ones, or all); their version."""
        state = model.state_dict()
        with self._lock:
            for name in self.tensors if everything else self.trainable:
                state[name].copy_(self.tensors[name])
            return int(self._value.value)
