"""The plain-text summary train.py prints at the end of a run, and its `optimized_metric` line.

Formatting only (plus the final per-budget evaluation `_before_after_lines` asks
`paravt.run.report.budget_eval` for): the run it describes is assembled by `paravt.run.build`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import DictConfig

from paravt.run.run_dirs import shown

if TYPE_CHECKING:
    from paravt.run.build import Run


def _cold_start_lines(result) -> list[str]:
    if result is None or not result.losses:
        return []
    losses = result.losses
    lines = [f"cold start: SFT loss {losses[0]:.3f} -> {losses[-1]:.3f} ({len(losses)} steps)"]
    lines += list(result.notes)
    for split in ("train", "held-out"):
        rows = [r for r in result.report.answer if r[1] == split]
        if rows:
            (_, _, l0, a0), (_, _, l1, a1) = rows[0], rows[-1]
            lines.append(
                f"cold start answer tokens ({split}, teacher-forced): loss {l0:.3f} -> {l1:.3f}, "
                f"accuracy {a0:.3f} -> {a1:.3f}"
            )
    lines.append(f"wall time: cold start {result.seconds:.0f} s")
    return lines


def _count(n: int, noun: str) -> str:
    """`1 step`, `5 steps`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def metric_line(cfg: DictConfig, value: float | None, run: Run) -> str:
    """`optimized_metric NAME = V` and, for the held-out default, which figure of the summary
    it is (the step table's last row, at one frame budget; not the all-budget headline)."""
    name = cfg.get("optimized_metric")
    line = f"optimized_metric {name} = {value}"
    for cb in run.trainer.callbacks:
        if getattr(cb, "history", None) and name and name.startswith(f"val/{cb.name}/"):
            k = run.datamodule.rollout.frame_budget
            line += f" (held-out '{cb.name}' at K={k}, the step table's last row)"
    return line


def _before_after_lines(module, agent, cold) -> list[str]:
    """Per-budget held-out table: after the cold start vs now (the same samples, greedy; the
    engine is synced to the final weights first, `budget_eval`)."""
    if cold is None or not cold.budget_before:
        return []
    import time

    from paravt.run.report import before_after_table, budget_eval, gain_line, tool_share_table

    t0 = time.perf_counter()
    before = list(cold.budget_before)
    after = budget_eval(module, agent, cold.report_samples, cold.report_frame_budgets)
    lines = ["held-out per frame budget (greedy; before = after the cold start, after = after RL):"]
    lines += before_after_table({"before": before, "after": after})
    lines.append(gain_line(before, after))
    shares = tool_share_table({"before": before, "after": after})
    if shares:
        lines.append("held-out share of samples calling each tool (all: every tool; greedy):")
        lines += shares
    seconds = time.perf_counter() - t0 + cold.report_seconds
    lines.append(f"wall time: per-budget evaluations {seconds:.0f} s")
    return lines


def _curve_lines(cfg: DictConfig) -> list[str]:
    from pathlib import Path

    from paravt.run.curves import write_curves

    tb = Path(str(cfg.run_dir)) / "tb"
    if not tb.exists():
        return []
    paths = write_curves(tb, Path(str(cfg.run_dir)) / "curves")
    return [f"curves: {', '.join(shown(p) for p in paths)}"]


def _skip_lines(datamodule, logged=None) -> list[str]:
    """What training left out: bad rows / videos at load, videos that failed mid-run.

    `logged` (the trainer's callback metrics) holds the last step's counts summed over ranks;
    the datamodule's own are this rank's (and may be newer): the larger of the two is shown.
    """
    counts = dict(getattr(datamodule, "skip_counts", lambda: {})())
    for key in counts:
        if logged is not None and key in logged:
            counts[key] = max(counts[key], float(logged[key]))
    if not any(counts.values()):
        return []
    parts = {
        "data/bad_rows": "{:.0f} bad row(s) at load",
        "data/bad_videos_at_load": "{:.0f} unusable video(s) at load",
        "data/undecodable_videos": "{:.0f} video(s) undecodable during training",
        "data/skipped_prompts": "{:.0f} prompt draw(s) left out for them",
        "data/undecodable_eval_videos": "{:.0f} held-out video(s) scored wrong",
    }
    said = [text.format(counts[key]) for key, text in parts.items() if counts.get(key)]
    lines = ["skipped: " + ", ".join(said)]
    report = getattr(datamodule, "load_report", None)
    reasons = list(report.skipped if report is not None else ())
    reasons += list(datamodule.bad_videos.items()) + list(datamodule.eval_video_errors.items())
    lines += [f"  {reason}" for _, reason in reasons[:5]]
    if len(reasons) > 5:
        lines.append(f"  ... {len(reasons) - 5} more in the log")
    return lines


def summary(
    cfg: DictConfig, run: Run, fit_seconds: float | None = None, total_seconds: float | None = None
) -> str:
    """A plain-text report of the run: cold start, held-out evaluations, training rewards, and
    the wall time of `Trainer.fit` (RL with its held-out evaluations) and of the whole run."""
    lines = [
        f"== paravt run '{cfg.get('run_name', cfg.name)}' ({run.trainer.global_step} RL steps) =="
    ]
    if cfg.get("ckpt_path"):
        step = getattr(run.module, "resumed_step", None)
        at = f" at step {step}" if step is not None else ""
        lines.append(f"resumed from {run.trainer.ckpt_path or cfg.ckpt_path}{at}")
    lines += _cold_start_lines(run.cold_start)
    for cb in run.trainer.callbacks:
        history = getattr(cb, "history", None)
        if history:
            k = run.datamodule.rollout.frame_budget  # DataModule.evaluate's frame budget
            lines.append(
                f"held-out '{cb.name}' during training ({len(cb.samples or ())} samples, greedy, "
                f"K={k} overview frames: rollout.frame_budget):"
            )
            lines.append("  step  accuracy  f_tau  kappa")
            for step, m in history:
                p = f"val/{cb.name}"
                lines.append(
                    f"  {step:>4}  {m[p + '/accuracy']:8.3f}  {m[p + '/f_tau']:5.3f}  "
                    f"{m[p + '/kappa']:5.2f}"
                )
    rewards = [r for _, r in getattr(run.module, "reward_history", [])]
    if rewards:
        k = max(1, min(5, len(rewards) // 2))
        first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
        lines.append(
            f"train reward (mean of {_count(k, 'step')}): first {first:.3f}, last {last:.3f}"
        )
    lines += _before_after_lines(run.module, run.datamodule.agent, run.cold_start)
    lines += _skip_lines(run.datamodule, run.trainer.callback_metrics)
    if fit_seconds is not None:
        steps = run.trainer.global_step - (getattr(run.module, "resumed_step", None) or 0)
        per = f", {fit_seconds / steps:.1f} s/step" if steps > 0 else ""
        total = f"; whole run {total_seconds:.0f} s" if total_seconds is not None else ""
        lines.append(
            f"wall time: RL {fit_seconds:.0f} s ({steps} steps{per}, held-out evaluations "
            f"included){total}"
        )
    lines += _curve_lines(cfg)
    folder = shown(cfg.run_dir)
    lines.append(f"logs: {folder}/tb   checkpoints: {folder}/checkpoints")
    return "\n".join(lines)
