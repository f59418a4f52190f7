"""The staleness contract of asynchronous rollouts, as pure arithmetic.

Versions count optimiser updates (`GRPOModule.policy_version`). A rollout sampled under version
v and trained when the trainer is at version V is V - v updates stale; `rollout.max_staleness`
bounds it. Generation of step s may START once the trainer has finished step t with
s - t <= max_staleness // updates_per_step (AReaL's `max_head_offpolicyness` gate, counted in
training steps: a batch is never begun more steps ahead than the bound allows). What gets past
the gate is checked again when trained (`too_stale`): such a batch is dropped and regenerated.
It deliberately knows nothing of processes, queues or engines.
"""

from __future__ import annotations


def lag_steps(max_staleness: int, updates_per_step: int) -> int:
    """How many training steps ahead of the trainer generation may run (0: none, as sync)."""
    if max_staleness < 0:
        raise ValueError(f"rollout.max_staleness must be >= 0, got {max_staleness}")
    return max_staleness // max(1, updates_per_step)


def last_startable_step(trained_steps: int, max_staleness: int, updates_per_step: int) -> int:
    """The last step whose generation may start once `trained_steps` steps are trained."""
    return trained_steps + lag_steps(max_staleness, updates_per_step)


def too_stale(trainer_version: int, sample_version: int, max_staleness: int) -> bool:
    """Whether rollouts of `sample_version` are more than `max_staleness` updates behind."""
    return trainer_version - sample_version > max_staleness
