"""Turn a composed Hydra config into (trainer, module, datamodule): the glue behind train.py.

Kept out of train.py so tests can compose and instantiate every experiment without running it.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from paravt.errors import UserError
from paravt.run.loggers import build_loggers, record_run
from paravt.run.run_dirs import shown

log = logging.getLogger(__name__)

# Lightning warnings that do not apply to this module's design, silenced by message.
_EXPECTED_WARNINGS = (
    ".*Using ModelCheckpoint with manual optimization.*",  # post-update state is what we save
    ".*module\\(s\\) in eval mode at the start of training.*",  # the frozen reference
    ".*overridden `transfer_batch_to_device`.*",  # prompt batches hold no tensors
    ".*Detected an existing checkpoint in.*",  # DCP rewriting `last.ckpt` each step (FSDP2)
)


@dataclass(frozen=True)
class Run:
    """The assembled run; `cold_start` holds the cold start's result once it ran."""

    trainer: Any
    module: Any
    datamodule: Any
    cold_start: Any = None  # paravt.run.coldstart.ColdStartResult


def build_callbacks(cfg: DictConfig) -> list:
    entries = {k: c for k, c in (cfg.get("callbacks") or {}).items() if c is not None}
    for name, c in entries.items():
        check_callback_target(name, str(c.get("_target_", "")))
    return [instantiate(c) for c in entries.values()]


def check_callback_target(name: str, target: str) -> None:
    """Refuse the callbacks' old global package name (`callbacks.X`), naming the new one."""
    if target.startswith("callbacks."):
        raise UserError(
            f"callbacks.{name}._target_={target}: paravt's callbacks are the package "
            f"`paravt.callbacks` (a global `callbacks` package is no longer installed); "
            f"fix: callbacks.{name}._target_=paravt.{target}"
        )


def build_module(cfg: DictConfig, init_on_meta: bool = False):
    from dataclasses import replace

    from paravt.modules.grpo import GRPOModule
    from paravt.rl.microbatch import max_response_tokens

    algorithm = instantiate(cfg.algorithm)
    if algorithm.norm_length is None:  # Dr.GRPO's divisor: the longest response the agent writes
        agent = cfg.rollout.agent
        length = max_response_tokens(agent.max_new_tokens, agent.max_rounds)
        algorithm = replace(algorithm, norm_length=length)
    return GRPOModule(
        model=instantiate(cfg.model),
        algorithm=algorithm,
        reward=instantiate(cfg.reward),
        optimizer=instantiate(cfg.optimizer),
        seed=cfg.seed,
        scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        init_on_meta=init_on_meta,
        **_judge(cfg),
    )


def _judge(cfg: DictConfig) -> dict:
    """GRPOModule's judge and judge_guard from the `judge` group (none by default)."""
    node = cfg.get("judge")
    if not node:
        return {}
    return {"judge": instantiate(node.client), "judge_guard": instantiate(node.guard)}


def shards_model(trainer) -> bool:
    """Whether `trainer` runs FSDP2 (the module's configure_model shards the policy), so the
    module can start as a meta-device skeleton that rank 0 fills after sharding."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return isinstance(trainer.strategy, ModelParallelStrategy)


def build_run(cfg: DictConfig) -> Run:
    import lightning.pytorch as pl

    for pattern in _EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    pl.seed_everything(cfg.seed, workers=True)
    # The DataModule generates the rollouts: it gets the rollout group (agent, crop, engine).
    # (a partial: kwargs given to `instantiate` would be turned back into plain config dicts)
    datamodule = instantiate(cfg.data, _partial_=True)(rollout=instantiate(cfg.rollout))
    logger = build_loggers(cfg)
    trainer = instantiate(cfg.trainer, callbacks=build_callbacks(cfg), logger=logger)
    record_run(logger, cfg)
    module = build_module(cfg, init_on_meta=shards_model(trainer))
    return Run(trainer=trainer, module=module, datamodule=datamodule)


PRIOR_KEY_PARTS = ("model", "cold_start", "data.generate", "rollout.agent", "rollout.crop")


def prior_key_parts(cfg: DictConfig) -> dict:
    """The config sections the tool prior and cold start depend on (their cache key, with
    `paravt.run.prior.stage_key` dropping the agent fields only RL reads)."""
    return {
        p: OmegaConf.to_container(OmegaConf.select(cfg, p), resolve=True) for p in PRIOR_KEY_PARTS
    }


def maybe_cold_start(cfg: DictConfig, run: Run) -> Run:
    """Supervised steps on teacher trajectories before RL, unless resuming or not configured:
    the run with the cold start's result kept (`run.cold_start`), or `run` unchanged."""
    if cfg.get("cold_start") is None or cfg.get("ckpt_path"):
        return run
    if shards_model(run.trainer):
        from paravt.errors import UserError

        raise UserError(
            "cold_start runs in one process before fit and cannot use trainer=fsdp / fsdp_cpu: "
            "set cold_start=null and start from an SFT checkpoint (experiment=sft_coldstart, "
            "then model.path=runs/sft_coldstart/hf)"
        )
    from paravt.run.coldstart import cold_start
    from paravt.run.coldstart_cache import cached_cold_start

    run.datamodule.prepare_data()
    run.datamodule.setup("fit")
    dm = run.datamodule
    agent = dm.connect(run.module)
    if cfg.get("prior") is not None:  # a tool prior first; both stages cached (prior.py)
        from paravt.run.prior import prior_then_cold_start

        result = prior_then_cold_start(
            run.module, agent, dm.train_samples, dm.eval_samples,
            instantiate(cfg.prior), instantiate(cfg.cold_start), prior_key_parts(cfg),
        )  # fmt: skip
    else:
        result = cached_cold_start(  # a sweep's jobs share one identical cold start
            cfg,
            run.module,
            lambda: cold_start(
                run.module, dm.train_samples, instantiate(cfg.cold_start), agent, dm.eval_samples
            ),  # it syncs the engine with the new weights before measuring anything
        )
    if result.cached:  # an engine with its own weights (vLLM, a stale-allowed copy) needs them
        dm.engine.sync_weights(run.module.policy, run.module.policy_version)
    return replace(run, cold_start=result)


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
            k = run.datamodule.rollout.default_budget
            line += f" (held-out '{cb.name}' at K={k}, the step table's last row)"
    return line


def _before_after_lines(module, agent, cold) -> list[str]:
    """Per-budget held-out table: after the cold start vs now (the same samples, greedy; the
    engine is synced to the final weights first, `budget_eval`)."""
    if cold is None or not cold.budget_before:
        return []
    import time

    from paravt.run.report import before_after_table, budget_eval, gain_line

    t0 = time.perf_counter()
    before = list(cold.budget_before)
    after = budget_eval(module, agent, cold.report_samples, cold.report_budgets)
    lines = ["held-out per frame budget (greedy; before = after the cold start, after = after RL):"]
    lines += before_after_table({"before": before, "after": after})
    lines.append(gain_line(before, after))
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
            k = run.datamodule.rollout.default_budget  # DataModule.evaluate's frame budget
            lines.append(
                f"held-out '{cb.name}' during training ({len(cb.samples or ())} samples, greedy, "
                f"K={k} overview frames: rollout.default_budget):"
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
