"""Small helpers of the training step: a phase timer, RNG state capture, tensor odds and ends.

Kept out of `grpo.py` so the LightningModule reads as its phases. Nothing here knows PARA-GRPO.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch


class PhaseTimer:
    """Wall-clock seconds per named phase, for the `time/*` metrics."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


def rng_state() -> dict:
    """RNG states in types `torch.load(weights_only=True)` accepts (numpy's as plain lists)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def grad_norm(model: torch.nn.Module) -> float:
    """The global L2 norm of `model`'s gradients (FSDP2 shards included: a collective then)."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads)
    return float(total.full_tensor() if hasattr(total, "full_tensor") else total)


def pad_rows(rows: Sequence[torch.Tensor], shape, device) -> torch.Tensor:
    """Stack 1-D rows of different lengths into a zero-padded [N, T] float tensor."""
    out = torch.zeros(shape, dtype=torch.float32, device=device)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r.to(device)
    return out
