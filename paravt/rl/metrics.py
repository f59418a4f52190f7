"""The two training-health figures of docs/method.md section 7, and the format-drift figures.

f_tau: mean format reward of a batch of training rollouts (format compliance at temperature 0.7).
kappa: mean number of tool calls per rollout. `drift_metrics`: the format-drift shares of the
Tool Prior Paradox (the prior's `<tool_code>` tag, dropped closing tags, missing answers).
`reversions` / `tag_reversion`: the tool turns that reverted to `<tool_code>`, per trajectory
and per step. `ruler_format`: the one ruler f_tau is read with in every arm (the reference's
string rules, no anchor term), beside the anchor bonus itself. Empty input gives 0.0, never NaN.

This module deliberately does not compute the format reward itself (paravt/rewards/) nor log
anything; it reduces numbers to numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from paravt.rewards.format import is_degenerate
from paravt.rewards.format_reference import reference_indicators, reference_total, reverted_turn
from paravt.types import RewardBreakdown, Trajectory

Values = Sequence[float] | Sequence[int] | Tensor


def format_compliance(reward: RewardBreakdown) -> float:
    """The per-rollout value f_tau averages: R_fmt itself, anchor bonus included, at most 1.

    With the reference formula (`paravt.rewards.format`) R_fmt is the reference release's own
    (<= 1; -0.15 for an unclosed think alone, kept, as the reference keeps it), so f_tau
    compares with the paper's 0.13-0.64; the legacy "mean" formula's values above 1 are
    clipped here to stay comparable.
    """
    return min(1.0, float(reward.format))


def _as_flat(values: Values) -> Tensor:  # [N] float64
    return torch.as_tensor(values, dtype=torch.float64).reshape(-1)


def _mean(values: Values) -> float:
    x = _as_flat(values)
    return float(x.mean()) if x.numel() else 0.0


def f_tau(format_rewards: Values) -> float:
    """Mean format reward of the training rollouts (0.0 for an empty batch)."""
    return _mean(format_rewards)


def kappa(num_calls: Values) -> float:
    """Mean number of tool calls per rollout (0.0 for an empty batch)."""
    return _mean(num_calls)


# The prior's dialect: a pretrained tool prior writes `<tool_code>` where the recipe wants
# `<tool_call>` (the "tag reversion" of the Tool Prior Paradox, PARAVT section 7).
PRIOR_TAG = "<tool_code>"
_PAIRS = (("<think>", "</think>"), ("<tool_call>", "</tool_call>"), (PRIOR_TAG, "</tool_code>"))
_PAIRS += (("<answer>", "</answer>"),)
DRIFT_KEYS = ("tag_reversion", "dropped_closers", "dropped_any", "no_answer")


def dropped_closers(text: str) -> int:
    """Closing tags missing from one text: sum over the tag pairs of max(0, opens - closes)."""
    return sum(max(0, text.count(o) - text.count(c)) for o, c in _PAIRS)


def drift_metrics(texts: Sequence[str]) -> dict[str, float]:
    """Per-step format-drift shares of the training rollouts (0.0 each for an empty batch).

    tag_reversion: share of rollouts holding the prior's `<tool_code>`; dropped_closers: mean
    number of missing closing tags per rollout; dropped_any: share with at least one;
    no_answer: share without a closed `<answer>...</answer>`.
    """
    n = len(texts)
    if not n:
        return {f"drift/{k}": 0.0 for k in DRIFT_KEYS}
    dropped = [dropped_closers(t) for t in texts]
    return {
        "drift/tag_reversion": sum(PRIOR_TAG in t for t in texts) / n,
        "drift/dropped_closers": sum(dropped) / n,
        "drift/dropped_any": sum(d > 0 for d in dropped) / n,
        "drift/no_answer": sum(not closed_answer(t) for t in texts) / n,
    }


def closed_answer(text: str) -> bool:
    """True when the text holds `<answer>` followed later by `</answer>`."""
    start = text.find("<answer>")
    return start >= 0 and text.find("</answer>", start) >= 0


def tool_turns(traj: Trajectory) -> int:
    """Turns of one trajectory that wrote at least one tool block (a valid call or not)."""
    return sum(1 for turn in traj.turns if turn.calls)


def reversions(traj: Trajectory) -> int:
    """Tool turns of one trajectory that opened the prior's `<tool_code>` instead of
    `<tool_call>` (counted whatever the dialect did with them: run, or answered with an error)."""
    return sum(1 for turn in traj.turns if turn.calls and reverted_turn(turn.text))


def tag_reversion(trajs: Sequence[Trajectory]) -> float:
    """Share of the batch's tool turns that reverted to `<tool_code>` (0.0 without tool turns)."""
    turns = sum(tool_turns(t) for t in trajs)
    return sum(reversions(t) for t in trajs) / turns if turns else 0.0


def ruler_format(text: str, min_think_chars: int = 10) -> float:
    """One rollout's format score on the one ruler, in [0, 1]: the reference release's string
    rules with the answer-suffix credits and no anchor term, whatever the arm trains with.

    think 0.2 + `<answer>` 0.3 + `</answer>` 0.2 (a non-empty answer), + 0.3 for a substantive
    think before a parseable call, + 0.1 for balanced tags once the score is > 0, at most 1.
    So a well-formed direct answer scores 0.8 and a well-formed tool rollout 1.0 in every arm;
    a degenerate text scores 0, as its reward does.
    """
    if is_degenerate(text):
        return 0.0
    indicators = reference_indicators(text, min_think_chars)
    return reference_total(indicators, text, 0.0, answer_suffix=True)[1]
