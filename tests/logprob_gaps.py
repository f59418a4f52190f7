"""The engine-vs-trainer check the engine tests share: for each trajectory, the largest
|teacher-forced - behaviour| log-prob over its sampled tokens."""

from __future__ import annotations

import torch

from paravt.models.forward import TokenIds, trajectory_logprobs


def logprob_gaps(model, processor, trajs, temperature: float) -> list[float]:
    """Per trajectory of `trajs`: max |trainer - engine| log-prob over its sampled tokens, the
    trainer's scored by `model` at `temperature` (the sampling one)."""
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    out = []
    for traj in trajs:
        with torch.no_grad():
            logp, batch, _ = trajectory_logprobs(model, [traj], ids, temperature)
        mask = batch.loss_mask[0]
        out.append((logp[0][mask] - batch.old_logp[0][mask]).abs().max().item())
    return out
