"""The staleness contract of asynchronous rollouts, as pure arithmetic.

Versions count optimiser updates (`GRPOModule.policy_version`). A rollout sampled under version
v and trained when the trainer is at version V is V - v updates stale; `rollout.max_staleness`
bounds it. Generation of step s may START once the trainer has finished step t with
s - t <= max_staleness // updates_per_step (AReaL's `max_head_offpolicyness` gate, counted in
training steps: a batch is never begun more steps ahead than the bound allows). What gets past
the gate is checked again when trained (`too_stale`): such a batch is dropped and regenerated.
With partial rollouts (`rollout.partial`) a trajectory's tokens may come from several versions:
the bound is checked on the oldest version behind any trained token (`oldest_version`).
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


VERSION_METRICS = (
    "rollout/stale_token_frac",
    "rollout/token_staleness_max",
    "rollout/mixed_version_frac",
)


def trained_versions(traj) -> list[int]:
    """The policy versions that sampled `traj`'s trained tokens (loss mask 1), sub-agent
    rollouts included; [] when the trajectory records none."""
    own = [v for v, m in zip(traj.versions, traj.loss_mask, strict=False) if m]
    return own + [v for sub in traj.sub_trajectories for v in trained_versions(sub)]


def oldest_version(trajs, default: int) -> int:
    """The oldest policy version behind any trained token of `trajs` (`default` when none
    records one): what the staleness bound is checked on, token by token."""
    found = [v for t in trajs if t is not None for v in trained_versions(t)]
    return min(found, default=default)


def version_metrics(trajs, trainer_version: int) -> dict[str, float]:
    """How off-policy a step's trained tokens are when the trainer at `trainer_version` takes
    them: the share sampled by an older policy, the largest per-token staleness, and the share
    of trajectories whose tokens come from more than one policy (a partial rollout resumed
    after a weight sync). All 0 without trained tokens: every rank logs the same keys."""
    per_traj = [trained_versions(t) for t in trajs if t is not None]
    tokens = [v for vs in per_traj for v in vs]
    if not tokens:
        return dict.fromkeys(VERSION_METRICS, 0.0)
    return {
        "rollout/stale_token_frac": sum(v < trainer_version for v in tokens) / len(tokens),
        "rollout/token_staleness_max": float(trainer_version - min(tokens)),
        "rollout/mixed_version_frac": sum(len(set(vs)) > 1 for vs in per_traj) / len(per_traj),
    }
