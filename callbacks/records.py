"""`latest_rollout`: the callbacks' checked read of `pl_module.last_rollout`.

`RolloutRecord` itself lives in the core (`paravt.rollout.records`) so that the installable
package does not depend on this folder; it is re-exported here for callers of the old path.
"""

from __future__ import annotations

from paravt.rollout.records import RolloutRecord

__all__ = ["RolloutRecord", "latest_rollout"]


def latest_rollout(pl_module: object, callback: str) -> RolloutRecord | None:
    """`pl_module.last_rollout`, with an error naming the contract when the module lacks it."""
    if not hasattr(pl_module, "last_rollout"):
        raise AttributeError(
            f"{callback} reads `last_rollout` from the LightningModule, but "
            f"{type(pl_module).__name__} has none; set `self.last_rollout = None` in __init__ and "
            "a paravt.rollout.records.RolloutRecord at the end of every training_step"
        )
    record = pl_module.last_rollout
    if record is not None and not isinstance(record, RolloutRecord):
        raise TypeError(
            f"{callback}: {type(pl_module).__name__}.last_rollout must be a "
            f"paravt.callbacks.records.RolloutRecord or None, got {type(record).__name__}"
        )
    return record
