"""The pre-RL diagnostic of the Tool Prior Paradox: what the starting policy does with tools.

From the checkpoint every arm's RL starts from (the tool prior, then the cold start), P prompts x
G rollouts at the sampling temperature at each frame budget K (the paradox benchmark: 32 x 4 at
K = 2 and K = 16), split into rollouts that wrote a tool block ("tool") and the others ("no
tool"): their share, the share of tool turns that reverted to `<tool_code>`, the share of calls
that ran (parsed and returned a crop; a malformed `<tool_call>` gets an error back), accuracy (mean
R_acc), no-answer rate (no closed `<answer>`), truncation rate (out of context or of new
tokens), and mean reward, raw and shaped as the arms shape it.
It tells whether the prior has what RL can lose: tool use common enough to matter, and paying
at a small K (accuracy with tools above without).

`diagnostic_rows` reduces rollouts to rows (pure); `run_diagnostic` samples and scores them
with a module's policy and reward; `diagnostic_table` lays the rows out as Markdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paravt.rl.advantages import shape_rewards
from paravt.rl.metrics import closed_answer, tag_reversion
from paravt.rl.objective import AdvantageConfig
from paravt.rollout.engine import SamplingParams
from paravt.rollout.sync.weight_sync import WeightSync
from paravt.types import RewardBreakdown, Sample, Trajectory

SPLITS = ("tool", "no tool")


@dataclass(frozen=True)
class DiagnosticRow:
    """One budget's rollouts of one split; every figure is 0.0 when `rollouts` is 0."""

    budget: int
    split: str
    rollouts: int
    share: float  # of the budget's rollouts
    reverted: float  # share of the split's tool turns written in the prior's `<tool_code>`
    ran: float  # share of the split's calls that ran (the others got an error back)
    accuracy: float
    no_answer: float
    truncated: float
    reward: float
    shaped: float


def is_truncated(traj: Trajectory) -> bool:
    """Stopped by the context limit or by the per-turn token cap, not by the model."""
    return traj.truncated or traj.finish_reason == "length"


def calls_ran(trajs: Sequence[Trajectory]) -> float:
    """Share of the calls of `trajs` that ran (0.0 without calls)."""
    calls = sum(t.num_calls for t in trajs)
    return sum(t.num_valid_calls for t in trajs) / calls if calls else 0.0


def shaped_totals(rewards: Sequence[RewardBreakdown], cfg: AdvantageConfig) -> list[float]:
    """Each reward as the update sees it before normalisation: shaped when `cfg.shaping`."""
    total = torch.tensor([r.total for r in rewards], dtype=torch.float64)
    if cfg.shaping:
        total = shape_rewards(total, cfg.shaping_scale, cfg.shaping_shift, cfg.shaping_clip)
    return total.tolist()


def diagnostic_rows(
    budget: int,
    trajs: Sequence[Trajectory],
    rewards: Sequence[RewardBreakdown],
    shaping: AdvantageConfig,
) -> list[DiagnosticRow]:
    """The "tool" and "no tool" rows of one budget's rollouts (with their rewards, in order)."""
    if len(trajs) != len(rewards):
        raise ValueError(f"got {len(rewards)} rewards for {len(trajs)} rollouts")
    shaped = shaped_totals(rewards, shaping)
    rows = []
    for split in SPLITS:
        picked = [i for i, t in enumerate(trajs) if (t.num_calls > 0) == (split == "tool")]
        n, chosen = len(picked), [trajs[i] for i in picked]

        def mean(values: Sequence[float], picked: list[int] = picked, n: int = n) -> float:
            return sum(values[i] for i in picked) / n if n else 0.0

        rows.append(
            DiagnosticRow(
                budget=budget,
                split=split,
                rollouts=n,
                share=n / len(trajs) if trajs else 0.0,
                reverted=tag_reversion(chosen),
                ran=calls_ran(chosen),
                accuracy=mean([r.accuracy for r in rewards]),
                no_answer=mean([float(not closed_answer(t.response_text)) for t in trajs]),
                truncated=mean([float(is_truncated(t)) for t in trajs]),
                reward=mean([r.total for r in rewards]),
                shaped=mean(shaped),
            )
        )
    return rows


def run_diagnostic(
    module,
    agent,
    samples: Sequence[Sample],
    shaping: AdvantageConfig,
    budgets: Sequence[int] = (2, 16),
    prompts: int = 32,
    group_size: int = 4,
    temperature: float = 0.7,
    seed: int = 0,
) -> list[DiagnosticRow]:
    """`prompts` samples x `group_size` rollouts of `module.policy` at each budget, sampled at
    `temperature` with `agent` (the RL agent), scored with `module.score`."""
    chosen = list(samples)[:prompts]
    by_id = {s.id: s for s in chosen}
    WeightSync.to_version(agent.engine, module.policy, module.policy_version)
    params = SamplingParams(agent.cfg.max_new_tokens, temperature, seed=seed)
    was_training = module.policy.training
    module.policy.eval()
    rows: list[DiagnosticRow] = []
    for k in budgets:
        trajs = list(agent.run(chosen, [k] * len(chosen), group_size, params))
        rewards = [module.score(t, by_id[t.sample_id]) for t in trajs]
        rows += diagnostic_rows(k, trajs, rewards, shaping)
    module.policy.train(was_training)
    return rows


def diagnostic_table(rows: Sequence[DiagnosticRow]) -> str:
    """Markdown rows `K | split | rollouts | share | reverted | calls ran | accuracy | no answer |
    truncated | reward | shaped`; a split without rollouts shows dashes."""
    head = (
        "| K | split | rollouts | share | reverted | calls ran | accuracy | no answer | truncated "
        "| reward | shaped |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        figures = (r.reverted, r.ran, r.accuracy, r.no_answer, r.truncated, r.reward, r.shaped)
        cells = [f"{v:.3f}" if r.rollouts else "-" for v in figures]
        lines.append(
            f"| {r.budget} | {r.split} | {r.rollouts} | {r.share:.2f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)
