"""Weights from the trainer's process to a generator process: one shared copy plus a version.

`SharedWeights.create` copies a model's state into tensors in shared memory (CPU) once; after
each update the trainer `publish`es the trainable parameters into them in place and bumps the
version; the generator `load_into`s its own model when the version moved. A lock keeps a reader
from seeing half an update. The object pickles into a `torch.multiprocessing` spawn child (the
tensors travel as shared-memory handles, not copies).

An FSDP2-sharded trainer: the full tensors are gathered from the shards bucket by bucket
(`paravt.rollout.sync.weight_sync.host_weights`, a collective: every rank calls `create` /
`publish`, or `gather_only` on the ranks that hold no `SharedWeights`) and rank 0, which owns the
generator, copies them in. When they are published and loaded: `WeightSync.publish` and
`WeightSync.into_generator`.

Where the copy lives, and what it costs: host shared memory only (`/dev/shm` on Linux; a
container needs it large enough, e.g. `docker run --shm-size`). Its floating-point tensors are
kept at the dtype the generator loads its policy in (`dtype`, the model's `dtype`: bfloat16 for
the real checkpoints), not at the trainer's fp32 master dtype: 2 bytes a parameter, about 16 GB
for an 8B model instead of 33 GB at fp32. On GPUs every publish is then a device-to-host copy
of the gathered weights on the owning rank and every load a host-to-device copy in the
generator; nothing travels as CUDA IPC handles (not implemented).

A generator whose engine keeps its weights elsewhere (rollout servers, `rollout/engine=
vllm_server`) makes no copy at all: `attach` makes the shared tensors its policy's own (a
meta-device skeleton's parameters, assigned), and each sync reads them in place under the lock
(`current`), so no GPU copy of the policy exists for staging (issue 50, finding 8).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from paravt.rollout.sync.weight_sync import host_weights


class SharedWeights:
    """A shared state dict, the version it holds, and the lock that guards both."""

    def __init__(self, tensors: dict[str, torch.Tensor], trainable: tuple[str, ...], value, lock):
        self.tensors, self.trainable, self._value, self._lock = tensors, trainable, value, lock
        self.dtype: torch.dtype | None = None  # `create`'s: every publish gathers at it
        self.attached = None  # the module whose tensors these are (`attach`, in the generator)

    @classmethod
    def create(
        cls, model, version: int, ctx, dtype=None, bucket_bytes: int = 256 << 20
    ) -> SharedWeights:
        """`model`'s full state in host shared memory, floating-point tensors at `dtype` (None:
        as they are)."""
        tensors = {
            k: v.to("cpu", copy=True).share_memory_()
            for k, v in host_weights(model, bucket_bytes, dtype)
        }
        trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
        shared = cls(tensors, trainable, ctx.Value("q", version), ctx.Lock())
        shared.dtype = dtype
        return shared

    @property
    def version(self) -> int:
        return int(self._value.value)

    @torch.no_grad()
    def publish(self, model, version: int, bucket_bytes: int = 256 << 20) -> None:
        """Copy `model`'s trainable parameters in and mark them `version`."""
        trainable = set(self.trainable)
        with self._lock:
            for name, tensor in host_weights(model, bucket_bytes, self.dtype):
                if name in trainable:
                    self.tensors[name].copy_(tensor)
            self._value.value = version

    def __getstate__(self) -> dict:
        return self.__dict__ | {"attached": None}  # a module stays in the process that made it

    @torch.no_grad()
    def attach(self, model) -> None:
        """Make the shared tensors `model`'s own (no copy; e.g. a meta-device skeleton's): it
        then always holds the newest published weights, read in place under `current`."""
        model.load_state_dict(self.tensors, strict=True, assign=True)
        model.tie_weights()  # assign replaced each tied tensor separately: tie them again
        self.attached = model

    @contextlib.contextmanager
    def current(self, model, everything: bool = False) -> Iterator[int]:
        """`model` with the newest published weights for the block; their version. A model
        with weights of its own is loaded (`load_into`) and the lock released before the block;
        the `attach`ed one is read in place, so the lock is held through the block: a publish
        waits instead of changing the weights half-way through a sync that reads them."""
        if model is not self.attached:
            yield self.load_into(model, everything)
            return
        with self._lock:
            yield int(self._value.value)

    @torch.no_grad()
    def load_into(self, model, everything: bool = False) -> int:
        """Copy the shared weights into `model` (trainable ones, or all); their version."""
        state = model.state_dict()
        with self._lock:
            for name in self.tensors if everything else self.trainable:
                state[name].copy_(self.tensors[name])
            return int(self._value.value)
