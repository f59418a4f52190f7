"""A step's rewards with an LLM judge: its open-ended answers judged concurrently, then guarded.

`judged_rewards` finds the answers that the judge will be asked about (open-ended, not empty,
not an exact match, not degenerate), has `LLMJudge.prefetch` score them in parallel, computes
every reward (`trajectory_reward`, which now reads the judge's cache), and passes the step's
counts, summed over ranks by `reduce`, to the `JudgeGuard`, which returns the `judge/*` metrics
or stops training. It deliberately knows nothing of Lightning: `reduce` is the glue's all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from paravt.rewards.accuracy import exact_match, extract_answer
from paravt.rewards.compose import RewardWeights, trajectory_reward
from paravt.rewards.format import is_degenerate
from paravt.rewards.judge import LLMJudge
from paravt.rewards.judge_guard import JudgeGuard
from paravt.types import RewardBreakdown, Sample, Trajectory

Reduce = Callable[[Sequence[float]], Sequence[float]]


def judge_items(
    trajs: Sequence[Trajectory], samples: Sequence[Sample]
) -> list[tuple[str, str, str]]:
    """(prediction, gold, question) of every answer `accuracy_reward` would send to the judge."""
    items = []
    for traj, sample in zip(trajs, samples, strict=True):
        if sample.question_type.strip().lower() != "oe" or is_degenerate(traj.response_text):
            continue
        answer = extract_answer(traj.response_text)
        if answer.strip() and not exact_match(answer, sample.answer):
            items.append((answer, sample.answer, sample.question))
    return items


def judged_rewards(
    trajs: Sequence[Trajectory],  # [N]
    samples: Sequence[Sample],  # [N] the prompt of each trajectory
    weights: RewardWeights,
    judge: LLMJudge,
    guard: JudgeGuard,
    reduce: Reduce = lambda xs: xs,
) -> tuple[list[RewardBreakdown], dict[str, float]]:
    """Rewards of one step with the judge, and its `judge/*` metrics (or JudgeFailure)."""
    judge.prefetch(judge_items(trajs, samples))
    rewards = [
        trajectory_reward(t, s, weights, judge=judge, open_ended="judge")
        for t, s in zip(trajs, samples, strict=True)
    ]
    stats = judge.take_stats()
    calls, fallbacks = reduce([stats.calls, stats.fallbacks])
    return rewards, guard.update(int(calls), int(fallbacks), judge.endpoint, stats.last_error)
