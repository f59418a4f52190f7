"""Cold start before RL: supervised steps on self-traced teacher trajectories.

The teacher (`paravt.agent.scripts.needle_teacher` behind a `ScriptedEngine`) drives the real agent
loop, so the trajectories hold real crops and real tool-response tokens, built exactly as RL
rollouts are. A few supervised steps on them give a tiny policy the format and the habit of
parallel crops; whether it can read the answer off the frames is what RL then has to improve.
This is the demo's stand-in for the paper's 97K-sample SFT stage, not a replacement for it.

The answer is a handful of the ~100 trained tokens (the rest is fixed think text and JSON), so the
whole-sequence loss says little about what was learnt: the answer tokens' own loss and accuracy,
teacher-forced, on the training and on held-out trajectories, are measured and reported apart.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from paravt.agent.loop import AgentLoop
from paravt.agent.scripts import (
    distinct_question_batches,
    needle_teacher,
    opened,
    teacher_plan,
)
from paravt.errors import check_stage_numbers
from paravt.modules.sft import SFTModule, example_from_trajectory
from paravt.progress import track
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.rollout.sync.weight_sync import WeightSync
from paravt.run.report import BudgetResult, budget_eval
from paravt.types import Sample, Trajectory

log = logging.getLogger(__name__)
TRACE_BATCH = 16  # prompts per traced batch: one progress tick each


@dataclass(frozen=True)
class ColdStartConfig:
    steps: int = 120
    lr: float = 3e-3
    batch_size: int = 8
    strategy: str = "search"  # "search" (crop the hinted span) | "oracle" (the true windows)
    frame_budgets: tuple[int, ...] = (4, 8)  # overview frame budgets K, cycled over samples
    # An imperfect teacher: per frame budget K, the shares of the teacher's strategies
    # (paravt.agent.scripts.STRATEGIES), e.g. {8: {search: 1, direct: 3}}; a K not named uses
    # `strategy` alone. Held-out answer tokens are always measured on `strategy` trajectories.
    teacher_mix: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    seed: int = 0  # which samples get which strategy of the mix
    # A reading curriculum: the first `oracle_steps` of `steps` train on "oracle" trajectories
    # (crops around the true needle, so the colour fills most crop frames) before the teacher's
    # own; a random vision tower learns to see the needle there first (docs/training.md).
    oracle_steps: int = 0
    # Train the vision tower during the cold start even when the model config freezes it (as
    # the paper's RL does): a random tiny tower must learn to see first; RL keeps it frozen.
    train_vision: bool = False
    # A LoRA policy (model.lora) trains its full language-model weights during the cold start
    # too, as a full SFT would; its adapters then fold in and restart at zero, and RL trains the
    # adapters only. False: the cold start trains the adapters alone (the base stays as built).
    full_weights: bool = True
    warmup_steps: int = 0  # linear warm-up, then cosine decay to `min_lr_ratio` * lr
    min_lr_ratio: float = 1.0  # 1.0: constant learning rate after the warm-up
    eval_every: int = 0  # measure answer tokens every N steps (0: only before and after)
    eval_limit: int = 16  # held-out trajectories per measurement
    # Greedy held-out rollouts per frame budget right after the cold start (the "before" column
    # of the run's table; the summary measures "after" on the same samples). () to skip.
    report_frame_budgets: tuple[int, ...] = ()
    report_limit: int = 64
    # Extra weight of the answer tokens' mean NLL: the answer is ~1 of ~135 trained tokens, so
    # with the token-mean loss alone the fixed think text and JSON drown its gradient.
    answer_weight: float = 0.0
    # Share of the training examples replayed from a tool prior's own corpus
    # (paravt.run.prior), as pretraining data is mixed into fine-tuning: the prior's habit then
    # survives a cold start long enough to fit the new call format. Needs a prior stage.
    prior_replay: float = 0.0

    def __post_init__(self) -> None:
        check_stage_numbers("cold_start", self)
        if not 0.0 <= self.prior_replay < 1.0:
            raise ValueError(f"cold_start.prior_replay must be in [0, 1), got {self.prior_replay}")


@dataclass
class ColdStartReport:
    """Losses of every step and answer-token measurements `(step, split, loss, accuracy)`."""

    losses: list[float] = field(default_factory=list)
    answer: list[tuple[int, str, float, float]] = field(default_factory=list)

    def last(self, split: str) -> tuple[float, float] | None:
        rows = [(loss, acc) for _, s, loss, acc in self.answer if s == split]
        return rows[-1] if rows else None


def mixed_plan(
    samples: Sequence[Sample], budgets: Sequence[int], cfg: ColdStartConfig
) -> dict[str, str]:
    """Sample id -> teacher strategy: `cfg.teacher_mix[K]`'s shares among the samples at K."""
    plan: dict[str, str] = {}
    mix = {int(k): dict(v) for k, v in cfg.teacher_mix.items()}
    for k in sorted(set(budgets)):
        ids = [s.id for s, b in zip(samples, budgets, strict=True) if b == k]
        plan |= teacher_plan(ids, mix.get(k) or {cfg.strategy: 1.0}, cfg.seed)
    return plan


def teacher_trajectories(
    agent: AgentLoop, samples: Sequence[Sample], cfg: ColdStartConfig, purpose: str = "train"
) -> list[Trajectory]:
    """One scripted trajectory per sample (in sample order), budgets cycling over
    `cfg.frame_budgets`, strategies drawn from `cfg.teacher_mix` per budget.

    Traced in batches of `TRACE_BATCH` prompts, with counts and an ETA (`paravt.progress.track`).
    """
    budgets = [cfg.frame_budgets[i % len(cfg.frame_budgets)] for i in range(len(samples))]
    plan = mixed_plan(samples, budgets, cfg)
    out: list[Trajectory | None] = [None] * len(samples)
    batches = [
        group[i : i + TRACE_BATCH]
        for group in distinct_question_batches(samples)
        for i in range(0, len(group), TRACE_BATCH)
    ]
    desc = f"cold start: teacher trajectories ({purpose}) for {len(samples)} prompts, batch"
    for batch in track(batches, desc=desc):
        part = [samples[i] for i in batch]
        per_turn = agent.crop.max_calls_per_turn  # the loop's cap: 1 is sequential dispatch
        respond = opened(needle_teacher(part, cfg.strategy, plan, per_turn), agent.cfg.force_think)
        engine = ScriptedEngine(agent.tokenizer, respond)
        tools = list(agent.executor.tools.values())  # the RL prompt's toolbox
        teacher = AgentLoop(
            engine, agent.renderer, agent.source, agent.cfg, agent.crop, tools=tools
        )
        trajs = teacher.run(part, [budgets[i] for i in batch], 1, SamplingParams(greedy=True))
        for i, traj in zip(batch, trajs, strict=True):
            out[i] = traj
    return [t for t in out if t is not None]


def interleave(main: Sequence, extra: Sequence, share: float) -> list:
    """`main` in order with items of `extra` (cycled, in order) spread evenly among them, so that
    `share` of the result (rounded to whole items) comes from `extra`."""
    if not share or not extra:
        return list(main)
    n_extra = round(len(main) * share / (1.0 - share))
    total = len(main) + n_extra
    slots = {i * total // n_extra for i in range(n_extra)}
    mains, extras = iter(main), (extra[i % len(extra)] for i in range(n_extra))
    return [next(extras) if j in slots else next(mains) for j in range(total)]


def teacher_summary(
    samples: Sequence[Sample], cfg: ColdStartConfig, trajs: Sequence[Trajectory]
) -> str:
    """One line: the teacher's strategy shares per frame budget and its crops per trajectory."""
    budgets = [cfg.frame_budgets[i % len(cfg.frame_budgets)] for i in range(len(samples))]
    plan = mixed_plan(samples, budgets, cfg)
    parts = []
    for k in sorted(set(budgets)):
        names = [plan[s.id] for s, b in zip(samples, budgets, strict=True) if b == k]
        shares = ", ".join(f"{n} {names.count(n) / len(names):.0%}" for n in sorted(set(names)))
        parts.append(f"K={k}: {shares}")
    calls = sum(t.num_valid_calls for t in trajs) / max(len(trajs), 1)
    steps = "step" if cfg.oracle_steps == 1 else "steps"
    lead = f"{cfg.oracle_steps} oracle-crop {steps}, then " if cfg.oracle_steps else ""
    return (
        f"cold start teacher ({len(trajs)} trajectories, {calls:.2f} crops each; {lead}"
        f"{'; '.join(parts)})"
    )


def lr_factor(step: int, cfg: ColdStartConfig) -> float:
    """Warm-up then cosine multiplier of `cfg.lr` for optimiser step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def sft_stage(policy, processor, cfg: ColdStartConfig) -> SFTModule:
    """The SFT module the cold start trains through: AdamW at `cfg.lr` on `lr_factor`'s
    schedule, padded batches, `cfg.answer_weight` on the answer tokens."""
    return SFTModule(
        policy=policy,
        processor=processor,
        optimizer=partial(torch.optim.AdamW, lr=cfg.lr, weight_decay=0.0),
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg)),
        packing=False,
        answer_weight=cfg.answer_weight,
    )


def _measure(report: ColdStartReport, step: int, sft: SFTModule, splits) -> None:
    for name, examples in splits.items():
        measured = sft.answer_metrics(examples) if examples else None
        if measured is not None:
            report.answer.append((step, name, *measured))
            log.info("cold start step %d: %s answer loss %.3f acc %.3f", step, name, *measured)


def fit(
    sft: SFTModule,
    trajs: Sequence[Trajectory],
    cfg: ColdStartConfig,
    held_out: Sequence[Trajectory] = (),
    first: Sequence[Trajectory] = (),
    replay: Sequence[Trajectory] = (),
) -> ColdStartReport:
    """`SFTModule.fit_steps` on the teacher's trajectories (cycled in order; `replay`'s mixed in
    at `cfg.prior_replay`), the first `cfg.oracle_steps` steps on `first` (when given), with
    answer-token measurements of train and `held_out` trajectories before, every
    `cfg.eval_every` steps and after (train: the teacher's own trajectories)."""
    tok = sft.processor.tokenizer
    examples, lead, held, replayed = (
        [example_from_trajectory(t, tok) for t in part] for part in (trajs, first, held_out, replay)
    )
    report = ColdStartReport()
    splits = {"train": examples[: cfg.eval_limit], "held-out": held[: cfg.eval_limit]}
    _measure(report, 0, sft, splits)

    def every(done: int) -> None:
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            _measure(report, done, sft, splits)

    records = sft.fit_steps(
        interleave(examples, replayed, cfg.prior_replay),
        cfg.steps,
        cfg.batch_size,
        lead=lead,
        lead_steps=cfg.oracle_steps,
        max_grad_norm=1.0,
        on_step=every,
        desc="cold start (SFT step)",
    )
    report.losses = [r["loss"] for r in records]
    _measure(report, cfg.steps, sft, splits)
    return report


@contextlib.contextmanager
def sft_trainable(model, train_vision: bool, full_weights: bool = False) -> Iterator[None]:
    """For the duration of a supervised stage: the vision tower trainable (`train_vision`) and a
    LoRA policy's frozen base weights too (`full_weights`); then every parameter's own flag."""
    from paravt.models.loading import vision_tower
    from paravt.models.lora import is_lora

    params = list(vision_tower(model).parameters()) if train_vision else []
    if full_weights and is_lora(model):
        tower = {id(p) for p in vision_tower(model).parameters()}
        params += [p for p in model.parameters() if id(p) not in tower]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)


@dataclass(frozen=True)
class ColdStartResult:
    """What the cold start did and measured, kept by the run (`Run.cold_start`) for its summary."""

    losses: tuple[float, ...]  # every SFT step's loss
    notes: tuple[str, ...]  # the teacher's summary lines
    report: ColdStartReport  # answer-token loss / accuracy on train and held-out
    seconds: float  # wall time of the cold start (teacher tracing + SFT)
    # The greedy held-out figures per frame budget right after it (the "before" of the run's
    # before/after table), on these samples and budgets, and the seconds they took.
    report_samples: tuple[Sample, ...] = ()
    report_frame_budgets: tuple[int, ...] = ()
    budget_before: tuple[BudgetResult, ...] = ()
    report_seconds: float = 0.0
    cached: bool = False  # loaded from an earlier job of its sweep (paravt.run.coldstart_cache)


def cold_start(
    module,
    samples: Sequence[Sample],
    cfg: ColdStartConfig,
    agent: AgentLoop,
    held_out: Sequence[Sample] = (),
    replay: Sequence[Trajectory] = (),
) -> ColdStartResult:
    """Fit `module.policy` to the teacher's trajectories (rendered and cropped by `agent`'s
    renderer, reader and tools; `replay`, a tool prior's corpus, mixed in at
    `cfg.prior_replay`), give `agent`'s engine the new weights, and measure the held-out
    figures per frame budget with them."""
    if cfg.prior_replay and not replay:
        raise ValueError(
            f"cold_start.prior_replay={cfg.prior_replay} replays a tool prior's corpus, and this "
            "run has none: configure a prior (experiment=demo_prior_paragrpo) or set "
            "cold_start.prior_replay=0"
        )
    t0 = time.perf_counter()
    # An agent program's rollouts (paravt.gateway.rollouts) are taught by paravt's own loop on
    # their engine; the held-out figures below are still the program's.
    teacher = getattr(agent, "loop", None) or agent
    trajs = teacher_trajectories(teacher, samples, cfg)
    calls = sum(t.num_valid_calls for t in trajs) / max(len(trajs), 1)
    log.info("cold start: %d teacher trajectories, %.2f crops each", len(trajs), calls)
    notes = (teacher_summary(samples, cfg, trajs),)
    reading = replace(cfg, teacher_mix={})  # held-out: how well the crops are read
    # Two more passes: the held-out answer-token report, and the oracle-crop steps' data.
    held = list(held_out)[: cfg.eval_limit]
    eval_trajs = teacher_trajectories(teacher, held, reading, "held-out report")
    first = []
    if cfg.oracle_steps:
        oracle = replace(reading, strategy="oracle")
        first = teacher_trajectories(teacher, samples, oracle, f"first {cfg.oracle_steps} steps")
    sft = sft_stage(module.policy, module.processor, cfg)
    with sft_trainable(module.policy, cfg.train_vision, cfg.full_weights):
        report = fit(sft, trajs, cfg, eval_trajs, first, replay)
    seconds = time.perf_counter() - t0
    # The weights changed under the same policy version: an engine with weights of its own
    # (vLLM, a stale-allowed copy) must get them before anything is measured with it.
    WeightSync.changed(agent.engine, module.policy, module.policy_version)
    module.reset_reference()
    result = ColdStartResult(tuple(report.losses), notes, report, seconds)
    if cfg.report_frame_budgets and held_out:
        t1 = time.perf_counter()
        chosen = tuple(list(held_out)[: cfg.report_limit])
        before = budget_eval(module, agent, chosen, cfg.report_frame_budgets)
        result = replace(
            result,
            report_samples=chosen,
            report_frame_budgets=tuple(cfg.report_frame_budgets),
            budget_before=tuple(before),
            report_seconds=time.perf_counter() - t1,
        )
    losses = report.losses
    log.info("cold start: loss %.3f -> %.3f over %d steps", losses[0], losses[-1], len(losses))
    return result
