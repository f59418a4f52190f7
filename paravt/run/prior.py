"""A tool prior for the tiny model, then the cold start, built once and cached by their config.

The Tool Prior Paradox (docs/paradox.md) needs a policy with tool habits of its own, the way a
pretrained Qwen3-VL has them. `prior_stage` gives the tiny model such a prior: supervised steps on
tool-using text in a competing dialect (its own tag `<tool_code>`, one Python-style call per line
`crop_video(start_time=..., end_time=...)`), `tool_share` of the corpus, the rest direct answers.
The corpus is traced with the "lines" tool dialect, so its calls run and their crops come back
before the answer: the prior learns to read crops, not to answer after an error. Reading needs
two things the text alone does not give a random tiny model (measured: docs/results.md, "Tool
Prior Paradox"): the answer tokens weighted apart (`answer_weight`: the answer is one of ~100
trained tokens), and a reading curriculum (`oracle_steps`: crops around the true needle first,
as the demo's cold start has); without them the prior learns the format and answers at chance.
The short cold start on the project's `<tool_call>` format then runs on top of it
(`paravt.run.coldstart.cold_start`). The strength of the prior (`steps`, `tool_share`) is the
experiment's knob; `tool_share=0` is the weak-prior contrast (the same steps, no tool use).

Whether the stages force the `<think>` prefix is `stage_think`'s choice, whatever the arm's RL
agent does: "forced" (the prefix at every turn) and "written" (never: the teacher opens each
thought itself, `paravt.agent.scripts.opened`, as the paper's SFT data does) give every arm of a
seed one checkpoint; "rl" follows the RL agent's `force_think`, a cold start matched to
the prompt RL trains under. The cache key holds the stages' effective choice (forced or written)
and leaves the RL-only agent fields out (`stage_key`), so arms that start alike share one entry.

`prior_then_cold_start` caches the policy after both stages under `cache_dir/<key>`, the key a
hash of every config that shapes them (model, prior, cold start, data, agent, crop), so the arms
of one experiment and their reruns share one prior and one cold start.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from paravt.agent.loop import AgentLoop
from paravt.agent.scripts import distinct_question_batches, needle_teacher, opened, teacher_plan
from paravt.errors import check_stage_numbers
from paravt.rl.metrics import PRIOR_TAG
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.types import Sample, Trajectory
from paravt.video.sampling import overview_indices, timestamps

if TYPE_CHECKING:
    from paravt.run.coldstart import ColdStartResult

log = logging.getLogger(__name__)
CACHE_VERSION = 3  # bump when the stages change what they train
# Agent fields the stages set themselves (RL may set them otherwise): forced think
# (`stage_think`), and the dialect each stage reads `<tool_code>` in (the prior runs its own
# calls; the cold start answers them with the RL dialect's error).
PRIOR_DIALECT, COLD_START_DIALECT = "lines", "tool_call"
RL_ONLY_AGENT_FIELDS = ("force_think", "tool_dialect")
STAGE_THINK = ("forced", "written", "rl")
_CALL_RE = re.compile(r"<tool_call>(\{.*?\})</tool_call>", re.DOTALL)
PRIOR_THOUGHT = "Let me look closer at the video first."
# The notes' probes: dialect rates on the first PROBE held-out prompts, the greedy reading at
# K = READING_BUDGET (where the demo's overview always shows the needle) on READING_PROBE.
PROBE, READING_PROBE, READING_BUDGET = 8, 32, 16


@dataclass(frozen=True)
class PriorConfig:
    steps: int = 150  # supervised steps on the prior's corpus (0: no prior stage)
    tool_share: float = 1.0  # share of prior-dialect tool-use text (the rest: direct answers)
    lr: float = 3e-3
    batch_size: int = 8
    frame_budgets: tuple[int, ...] = (2, 4)  # cycled over the corpus: (2, 4, 2, 4, 16) is 2:2:1
    train_vision: bool = True  # a pretraining stage trains the whole (random) model
    # A reading curriculum, as the demo's cold start has: the first `oracle_steps` of `steps`
    # train on `<tool_code>` crops around the true needle (the colour fills most crop frames),
    # so that the random vision tower learns to see before the corpus's wide crops; with
    # tool_share 0, on direct answers from the smallest of `frame_budgets` whose overview
    # shows the needle instead (`oracle_budgets`).
    oracle_steps: int = 0
    # Extra weight of the answer tokens' mean NLL (paravt.modules.sft.SFTModule): the answer
    # is one of ~100 trained tokens, and without it the prior learns the text, not the colour.
    answer_weight: float = 1.0
    warmup_steps: int = 0  # linear warm-up, then cosine decay to `min_lr_ratio` * lr
    min_lr_ratio: float = 1.0
    seed: int = 0
    cache_dir: str = "artifacts/prior_cache"
    # Do both stages force the `<think>` prefix? "forced" | "written" (the model writes it) |
    # "rl" (as the RL agent's `force_think`)
    stage_think: str = "forced"

    def __post_init__(self) -> None:
        check_stage_numbers("prior", self)
        if self.stage_think not in STAGE_THINK:
            raise ValueError(
                f"prior.stage_think must be one of {STAGE_THINK}, got {self.stage_think!r}"
            )
        if self.steps < 0 or not 0.0 <= self.tool_share <= 1.0:
            raise ValueError(
                f"prior.steps must be >= 0 and prior.tool_share in [0, 1], got steps="
                f"{self.steps}, tool_share={self.tool_share}"
            )
        if not 0 <= self.oracle_steps <= self.steps:
            raise ValueError(
                f"prior.oracle_steps must be in [0, prior.steps={self.steps}], got "
                f"{self.oracle_steps}"
            )
        if not self.frame_budgets or min(self.frame_budgets) < 1:
            raise ValueError(f"prior.frame_budgets must be >= 1 each, got {self.frame_budgets}")

    def forces_think(self, rl_force_think: bool) -> bool:
        """Whether the stages force the `<think>` prefix, for an RL agent forcing it or not."""
        return self.stage_think == "forced" or (self.stage_think == "rl" and rl_force_think)


def prior_dialect(text: str) -> str:
    """The prior's version of one teacher turn: each `<tool_call>` JSON call becomes a line
    `crop_video(start_time=..., end_time=...)` in one `<tool_code>` block, after the prior's own
    thought (the form the "lines" tool dialect runs)."""
    calls = []
    for body in _CALL_RE.findall(text):
        args = json.loads(body).get("arguments", {})
        start, end = args.get("start_time"), args.get("end_time")
        calls.append(f"crop_video(start_time={start}, end_time={end})")
    if not calls:
        return text
    return f"{PRIOR_THOUGHT}</think>\n{PRIOR_TAG}\n" + "\n".join(calls) + "\n</tool_code>"


def prior_teacher(
    samples: Sequence[Sample], plan: dict[str, str], force_think: bool = True
) -> Callable[[str], str]:
    """The needle teacher with its tool turns rewritten into the prior's dialect; traced with
    the "lines" dialect, its calls run and it answers after their crops. `force_think`: whether
    the prompt supplies the `<think>` prefix (else each turn opens it, `opened`)."""
    respond = needle_teacher(samples, "search", plan)
    return opened(lambda context: prior_dialect(respond(context)), force_think)


def prior_trajectories(
    agent: AgentLoop, samples: Sequence[Sample], cfg: PriorConfig, oracle: bool = False
) -> list[Trajectory]:
    """One prior-corpus trajectory per sample: `tool_share` `<tool_code>` searches whose crops
    come back before the answer, the rest direct answers, budgets cycling over `cfg.frame_budgets`;
    `oracle`: the reading curriculum instead, every sample's crop around its true needle, or
    with `tool_share` 0 a direct answer from an overview that shows it (`oracle_budgets`)."""
    budgets = [cfg.frame_budgets[i % len(cfg.frame_budgets)] for i in range(len(samples))]
    mix = {"oracle": 1.0} if oracle else {"search": cfg.tool_share, "direct": 1.0 - cfg.tool_share}
    if oracle and not cfg.tool_share:
        shown = oracle_budgets(agent, samples, cfg.frame_budgets)
        samples = [s for s, k in zip(samples, shown, strict=True) if k]
        budgets, mix = [k for k in shown if k], {"direct": 1.0}
    plan = teacher_plan([s.id for s in samples], {k: v for k, v in mix.items() if v}, cfg.seed)
    stage = stage_agent(agent, PRIOR_DIALECT, cfg.forces_think(agent.cfg.force_think))
    out: list[Trajectory] = []
    for group in distinct_question_batches(samples):
        part = [samples[i] for i in group]
        engine = ScriptedEngine(agent.tokenizer, prior_teacher(part, plan, stage.cfg.force_think))
        tools = list(agent.executor.tools.values())  # the RL prompt's toolbox
        teacher = AgentLoop(
            engine, agent.renderer, agent.source, stage.cfg, agent.crop, tools=tools
        )
        out += teacher.run(part, [budgets[i] for i in group], 1, SamplingParams(greedy=True))
    return out


def stage_agent(agent: AgentLoop, dialect: str, forced: bool = True) -> AgentLoop:
    """`agent` with `dialect` and the forced `<think>` prefix on or off:
    same engine, renderer, frame source and crops."""
    cfg = replace(agent.cfg, force_think=forced, tool_dialect=dialect)
    tools = list(agent.executor.tools.values())
    return AgentLoop(agent.engine, agent.renderer, agent.source, cfg, agent.crop, tools=tools)


def stage_key(agent_cfg: dict) -> dict:
    """The agent config as the cache key sees it: without the fields RL may change alone."""
    return {k: v for k, v in agent_cfg.items() if k not in RL_ONLY_AGENT_FIELDS}


def stages_key(prior: PriorConfig, key_parts: dict) -> str:
    """The cache key of the prior and cold start: `prior` (its folder aside, its `stage_think`
    as the stages apply it: "forced" or "written") and `key_parts`, with
    `key_parts["rollout.agent"]`, when given, keyed without the RL-only fields."""
    parts = dict(key_parts)
    agent_cfg = parts.get("rollout.agent")
    rl_force_think = True
    if isinstance(agent_cfg, dict):
        rl_force_think = agent_cfg.get("force_think", True)
        parts["rollout.agent"] = stage_key(agent_cfg)
    applied = "forced" if prior.forces_think(rl_force_think) else "written"
    return cache_key({"prior": asdict(replace(prior, cache_dir="", stage_think=applied)), **parts})


def dialect_rates(
    agent: AgentLoop, samples: Sequence[Sample], budget: int, params: SamplingParams
) -> dict[str, float]:
    """Shares of rollouts (one per sample at `budget`) writing `<tool_code>`, `<tool_call>`, and
    a closed `<answer>`: how far a policy speaks the prior's dialect."""
    trajs = agent.run(list(samples), [budget] * len(samples), 1, params)
    n = max(len(trajs), 1)
    texts = [t.response_text for t in trajs]
    return {
        "tool_code": sum(PRIOR_TAG in t for t in texts) / n,
        "tool_call": sum("<tool_call>" in t for t in texts) / n,
        "answer": sum("</answer>" in t for t in texts) / n,
    }


def greedy_reading(
    agent: AgentLoop, samples: Sequence[Sample], budget: int = READING_BUDGET
) -> dict[str, float]:
    """Greedy rollouts (one per sample at `budget`), scored by R_acc (`trajectory_reward`): the
    accuracy of those that wrote no tool block (answered from the overview; 0.0 when none), of
    those that did, their counts and the tool-block share. Does the prior read the needle?"""
    from paravt.rewards.compose import trajectory_reward
    from paravt.rl.metrics import tool_turns

    params = SamplingParams(agent.cfg.max_new_tokens, greedy=True)
    trajs = agent.run(list(samples), [budget] * len(samples), 1, params)
    by_id = {s.id: s for s in samples}
    right = {t.sample_id: trajectory_reward(t, by_id[t.sample_id]).accuracy for t in trajs}
    tools = [t.sample_id for t in trajs if tool_turns(t)]
    free = [t.sample_id for t in trajs if not tool_turns(t)]
    return {
        "budget": budget,
        "accuracy_without_tools": sum(right[i] for i in free) / max(len(free), 1),
        "accuracy_with_tools": sum(right[i] for i in tools) / max(len(tools), 1),
        "without_tools": len(free),
        "with_tools": len(tools),
        "tool_share": len(tools) / max(len(trajs), 1),
    }


def reading_note(stage: str, reading: dict[str, float]) -> str:
    """`greedy_reading`'s figures in one line; an accuracy over no rollout is shown as "-"."""

    def acc(split: str) -> str:
        return f"{reading['accuracy_' + split]:.3f}" if reading[split] else "-"

    n = reading["without_tools"] + reading["with_tools"]
    return (
        f"{stage}: greedy held-out accuracy at K={reading['budget']} without tools: "
        f"{acc('without_tools')} ({reading['without_tools']} of {n} rollouts; with a tool "
        f"block: {acc('with_tools')}, {reading['with_tools']})"
    )


def prior_stage(
    module,
    agent: AgentLoop,
    samples: Sequence[Sample],
    cfg: PriorConfig,
    corpus: Sequence[Trajectory] | None = None,
) -> list:
    """Supervised steps of `module.policy` on the prior's corpus (`corpus` when already traced,
    else `prior_trajectories`'); returns the step losses."""
    from paravt.modules.sft import example_from_trajectory
    from paravt.run.coldstart import ColdStartConfig, sft_stage, sft_trainable

    tok = module.processor.tokenizer
    if corpus is None:
        corpus = prior_trajectories(agent, samples, cfg)
    examples = [example_from_trajectory(t, tok) for t in corpus]
    lead = []
    if cfg.oracle_steps:
        oracle = prior_trajectories(agent, samples, cfg, oracle=True)
        lead = [example_from_trajectory(t, tok) for t in oracle]
    schedule = ColdStartConfig(
        lr=cfg.lr,
        steps=cfg.steps,
        warmup_steps=cfg.warmup_steps,
        min_lr_ratio=cfg.min_lr_ratio,
        answer_weight=cfg.answer_weight,
    )
    sft = sft_stage(module.policy, module.processor, schedule)
    # A pretraining stage: a LoRA policy's base weights learn the prior too.
    with sft_trainable(module.policy, cfg.train_vision, full_weights=True):
        records = sft.fit_steps(
            examples,
            cfg.steps,
            cfg.batch_size,
            lead=lead,
            lead_steps=cfg.oracle_steps,
            max_grad_norm=1.0,
            desc="tool prior (SFT step)",
        )
    return [r["loss"] for r in records]


def cache_key(parts: dict) -> str:
    """16 hex digits of the SHA-256 of `parts` as sorted JSON (plus the stages' version)."""
    blob = json.dumps({"version": CACHE_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def oracle_budgets(
    agent: AgentLoop, samples: Sequence[Sample], frame_budgets: Sequence[int]
) -> list[int | None]:
    """Per sample, the smallest of `frame_budgets` whose overview (as `agent` shows it) holds a
    frame of a target window: the fewest frames, so the needle is the largest share of them.
    None where no budget shows it (a direct answer there is a guess). Refused when none does."""
    out = []
    for sample in samples:
        info = agent.source.info(sample.video)
        shows = [k for k in sorted(set(frame_budgets)) if shows_window(info, k, sample.windows)]
        out.append(shows[0] if shows else None)
    if samples and not any(out):
        raise ValueError(
            f"no overview at prior.frame_budgets={tuple(frame_budgets)} shows a sample's target "
            "window: a tool-free reading curriculum needs a budget that does (e.g. 16)"
        )
    return out


def shows_window(info, budget: int, windows) -> bool:
    """Whether the `budget`-frame overview of a video (`info`: its frames and fps) has a frame
    whose start time lies in one of `windows` (seconds, [start, end))."""
    stamps = timestamps(overview_indices(info.num_frames, budget), info.fps)
    return any(lo - 1e-6 <= t < hi - 1e-6 for t in stamps for lo, hi in windows)


def _notes(module, agent, samples, prior: PriorConfig, losses, stage: str) -> list[str]:
    """The stage's SFT loss and dialect rates on the probe's first `PROBE` prompts, and its
    greedy reading at K = 16 (`greedy_reading`) on all of `samples`."""
    if not samples:
        return []
    reading = reading_note(stage, greedy_reading(agent, samples))
    samples = samples[:PROBE]
    k = prior.frame_budgets[-1]
    tokens = agent.cfg.max_new_tokens
    greedy = dialect_rates(agent, samples, k, SamplingParams(tokens, greedy=True))
    hot = dialect_rates(agent, samples, k, SamplingParams(tokens, 0.7, seed=prior.seed))
    loss = f"SFT loss {losses[0]:.3f} -> {losses[-1]:.3f}, " if losses else ""
    return [
        f"{stage}: {loss}K={k}, {len(samples)} held-out prompts: <tool_code> greedy "
        f"{greedy['tool_code']:.2f} / T=0.7 {hot['tool_code']:.2f}, <tool_call> greedy "
        f"{greedy['tool_call']:.2f} / T=0.7 {hot['tool_call']:.2f}",
        reading,
    ]


def cached_prior(
    module,
    agent: AgentLoop,
    samples,
    probe,
    prior: PriorConfig,
    key_parts: dict,
    corpus: Callable[[], list[Trajectory]] | None = None,
):
    """The prior stage on `module.policy`, or its policy loaded from `cache_dir/prior-<key>`
    (the key without the cold start's config, so that tuning the cold start reuses the prior);
    returns the prior's notes. `corpus`: the prior's corpus, traced on first call (shared with
    the cold start's replay), else traced here."""
    from paravt.modules.checkpoint import atomic_torch_save

    key = stages_key(prior, {k: v for k, v in key_parts.items() if k != "cold_start"})
    path = Path(prior.cache_dir) / f"prior-{key}" / "state.pt"
    if path.exists():
        payload = torch.load(path, map_location="cpu", weights_only=False)
        module.policy.load_state_dict(payload["policy"])
        log.info("tool prior loaded from %s", path)
        return [*payload["notes"], f"tool prior: cache prior-{key} reused"]
    losses = prior_stage(module, agent, samples, prior, corpus() if corpus else None)
    stage = stage_agent(agent, PRIOR_DIALECT, prior.forces_think(agent.cfg.force_think))
    notes = _notes(module, stage, probe, prior, losses, "tool prior")
    atomic_torch_save({"policy": module.policy.state_dict(), "notes": notes}, path)
    return notes


def prior_then_cold_start(
    module, agent: AgentLoop, samples, held_out, prior: PriorConfig, cold, key_parts: dict
) -> ColdStartResult:
    """The tool prior then the cold start on `module.policy`, or both loaded from the cache;
    returns the cold start's result with the prior's notes added.
    `prior.steps == 0` skips the prior stage; the cache key is `stages_key`'s."""
    from paravt.modules.checkpoint import atomic_torch_save
    from paravt.run.coldstart import cold_start

    key = stages_key(prior, key_parts)
    path = Path(prior.cache_dir) / key
    probe = list(held_out)[:READING_PROBE]
    if (path / "state.pt").exists():
        payload = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
        module.policy.load_state_dict(payload["policy"])
        module.reset_reference()
        result: ColdStartResult = payload["result"]
        log.info("tool prior and cold start loaded from %s", path)
        note = f"prior and cold start: cache {key} reused"
        return replace(result, notes=(*result.notes, note), cached=True)
    t0 = time.perf_counter()
    notes: list[str] = []
    # The prior's corpus is traced at most once: the prior stage (unless cached) and the cold
    # start's replay share it.
    corpus = functools.cache(lambda: prior_trajectories(agent, samples, prior))
    if prior.steps:
        notes += cached_prior(module, agent, samples, probe, prior, key_parts, corpus)
    switched = stage_agent(agent, COLD_START_DIALECT, prior.forces_think(agent.cfg.force_think))
    replay = corpus() if cold.prior_replay and prior.steps else []
    result = cold_start(module, samples, cold, switched, held_out, replay)
    if replay:
        notes.append(
            f"cold start: {cold.prior_replay:.0%} of its examples replayed from the prior's "
            f"corpus ({len(replay)} trajectories)"
        )
    notes += _notes(module, switched, probe, prior, [], "after the cold start")
    for line in notes:
        log.info(line)
    result = replace(result, notes=(*notes, *result.notes), seconds=time.perf_counter() - t0)
    state = {"policy": module.policy.state_dict(), "result": result}
    atomic_torch_save(state, path / "state.pt")  # temp file, fsync, rename
    log.info("tool prior and cold start cached in %s", path)
    return result
