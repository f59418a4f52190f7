"""`SharedWeights`: the host shared-memory copy the async generator reads, kept at the
generator's load dtype (half the bytes of the trainer's fp32 master weights in bf16)."""

from __future__ import annotations

import copy

import torch
import torch.multiprocessing as mp

from paravt.rollout.sync.shared_weights import SharedWeights


class Policy(torch.nn.Module):
    """fp32 weights (the trainer's master dtype) and an integer buffer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 4)
        self.register_buffer("steps", torch.tensor([3, 5], dtype=torch.int64))


def test_the_shared_copy_is_host_memory_at_the_generators_dtype():
    trainer = Policy()
    generator = copy.deepcopy(trainer).to(torch.bfloat16)
    shared = SharedWeights.create(trainer, 0, mp.get_context("spawn"), torch.bfloat16)
    dtypes = {k: t.dtype for k, t in shared.tensors.items()}
    assert dtypes == {
        "proj.weight": torch.bfloat16,
        "proj.bias": torch.bfloat16,
        "steps": torch.int64,
    }
    assert all(t.device.type == "cpu" and t.is_shared() for t in shared.tensors.values())
    # 36 weights at 2 bytes + 2 int64 steps: 88 bytes (at fp32: 36 x 4 + 16 = 160)
    assert sum(t.nbytes for t in shared.tensors.values()) == 36 * 2 + 2 * 8

    with torch.no_grad():
        trainer.proj.weight.add_(0.25)  # an update, published as version 1
    shared.publish(trainer, 1)
    generator.proj.weight.data.zero_()
    assert shared.load_into(generator) == 1
    assert torch.equal(generator.proj.weight, trainer.proj.weight.to(torch.bfloat16))
    assert trainer.proj.weight.dtype == torch.float32  # the trainer's own weights untouched
