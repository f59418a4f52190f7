"""Lightning callbacks for PARA-GRPO training, usable in any Lightning project.

- `FrameBudgetGating`: frame-budget gating, a per-prompt frame budget K for the DataModule;
  logs the gate ratio (`FrameBudgetRandomization` is its former name).
- `FormatAnchorCurriculum`: schedules the format-reward weight and the anchor coefficient.
- `RolloutLogger`: writes a few rollouts (text, crop timeline image) to TensorBoard.
- `BenchmarkValidation`: evaluates the agent on a held-out file; logs accuracy, f_tau, kappa.
- `ToolUseAlarm`: warns when tool use collapses (kappa low, or tag reversion high, for N steps).

What a module must provide (each callback checks only what it uses, in `setup` or when it
first reads it, and names the missing piece):
- `pl_module.last_rollout: paravt.rollout.records.RolloutRecord | None`, None in `__init__` and
  set at the end of every `training_step`: the step's N = B * G trajectories and rewards,
  group-major (the G rollouts of prompt b are contiguous), with each prompt's frame budget,
  ground-truth windows and video duration (FrameBudgetGating, RolloutLogger).
- `FormatAnchorCurriculum`: the module implements `format_anchor.FormatWeighted`
  (`set_format_weight(w)`) and/or `format_anchor.AnchorWeighted` (`set_anchor_coef(c)`), for
  the schedules configured; checked in `setup`.
- `FrameBudgetGating`: the DataModule implements `frame_budget.BudgetSink`
  (`set_budget_sampler(sampler)`) and calls `sampler(prompt_id: str, epoch: int) -> int` for
  every prompt when it builds a batch (not in its `setup`, which Lightning runs before the
  callbacks'); checked in `setup`. With plain dataloaders, call `callback.sampler.budget(
  prompt_id, epoch)` where the batch is built (checked after the first batch). Its gate reads
  `last_rollout` as a RolloutRecord or the light `GateRecord` (rewards and tool-call counts
  [B, G], budgets [B]); without `last_rollout` it warns and logs no gate.
- `pl_module.evaluate_agent(samples, greedy=True) -> list[Trajectory]` (one per sample, in order)
  and `pl_module.score(trajectory, sample) -> RewardBreakdown` (BenchmarkValidation).

Steps: "every n steps" (RolloutLogger, BenchmarkValidation) and the curriculum's schedules count
optimizer steps (`trainer.global_step`), which advance by several per batch when the module
steps its optimizer several times (PPO epochs); the triggers fire whenever a multiple of n is
crossed. Per-rollout logs are written at `RolloutRecord.step`.

Logging: every scalar a callback produces goes through `pl_module.log` / `log_dict`, so it is in
`trainer.callback_metrics` for ModelCheckpoint or EarlyStopping to monitor. The gate ratios and
the validation figures are also written to the loggers directly, at the step they describe.
"""

from paravt.callbacks.benchmark_validation import BenchmarkValidation
from paravt.callbacks.format_anchor import FormatAnchorCurriculum
from paravt.callbacks.frame_budget import (  # FrameBudgetRandomization: the former name
    FrameBudgetGating,
    FrameBudgetRandomization,
    GateRecord,
)
from paravt.callbacks.records import RolloutRecord
from paravt.callbacks.rollout_logger import RolloutLogger
from paravt.callbacks.tool_alarm import ToolUseAlarm

__all__ = [
    "BenchmarkValidation",
    "FormatAnchorCurriculum",
    "FrameBudgetGating",
    "FrameBudgetRandomization",
    "GateRecord",
    "RolloutLogger",
    "RolloutRecord",
    "ToolUseAlarm",
]
