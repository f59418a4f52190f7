"""Supervised steps on token-exact trajectories (the core of cold-start SFT).

The loss is the mean negative log-likelihood of the trained (mask-1) tokens, computed with the
same teacher-forced pass the RL trainer uses, so SFT and RL see identical token/visual layouts.
This file deliberately holds no Lightning code; the SFT LightningModule wraps these functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paravt.modules.forward import TokenIds, trajectory_logprobs
from paravt.progress import track
from paravt.types import Trajectory


def sft_loss(
    logp: torch.Tensor,  # [N, T]
    loss_mask: torch.Tensor,  # [N, T] bool
) -> torch.Tensor:
    """Token-mean negative log-likelihood over trained tokens; 0 when nothing is trained."""
    picked = torch.where(loss_mask, logp, torch.zeros_like(logp))
    return -picked.sum() / loss_mask.sum().clamp(min=1)


def supervised_steps(
    model,
    trajectories: Sequence[Trajectory],
    ids: TokenIds,
    steps: int,
    lr: float = 3e-3,
    batch_size: int = 8,
) -> list[float]:
    """Run `steps` AdamW steps over `trajectories` (cycled in order); return the losses."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in track(range(steps), desc="cold start (SFT step)", every=10):
        start = (step * batch_size) % len(trajectories)
        batch = [trajectories[(start + i) % len(trajectories)] for i in range(batch_size)]
        logp, padded, _ = trajectory_logprobs(model, batch, ids)
        loss = sft_loss(logp, padded.loss_mask.to(logp.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses
