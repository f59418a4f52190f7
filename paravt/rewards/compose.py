"""The scalar PARA-GRPO reward of one trajectory, with every term kept for logging.

    R = R_acc + fmt * R_fmt + tool * R_tool

(docs/method.md section 3; R_fmt already holds its anchor bonus, see `format.py`). A degenerate
completion (`is_degenerate`) scores exactly 0. A rollout an agent program played through the
gateway may carry the reward the program posted; `agent_reward` says what is trained on: R
(paravt), the posted reward (agent) or their sum. Every weight is a field of the frozen
`RewardWeights`, plain numbers only, so Hydra can build it straight from YAML. This module knows
nothing of Hydra or tokens; `trajectory_reward` reads a rollout's text and tool counters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from paravt.rewards.accuracy import Judge, accuracy_reward, extract_answer
from paravt.rewards.format import FORMULAS, FormatTerms, format_reward, is_degenerate
from paravt.rewards.tool import tool_reward
from paravt.types import ParsedCall, RewardBreakdown, Sample, ToolResult, Trajectory

CREDIT_WEIGHTS = ("think", "answer", "order", "balance")  # the credit formulas' weights
# reward.agent_reward: the trained total from paravt's R and the agent program's posted reward
AGENT_REWARDS = {
    "paravt": lambda paravt, posted: paravt,
    "agent": lambda paravt, posted: posted,
    "sum": lambda paravt, posted: paravt + posted,
}


@dataclass(frozen=True)
class RewardWeights:
    """Every coefficient of the reward; defaults are the reference recipe."""

    format_weight: float = 1.0  # w_fmt on R_fmt
    tool_weight: float = 1.0  # w_tool on R_tool
    anchor_weight: float = 0.5  # lambda_anchor on the string-level anchor bonus inside R_fmt
    think: float = 0.25  # fixed weights of the four format credits (format.py)
    answer: float = 0.25
    order: float = 0.25
    balance: float = 0.25
    closed_think_bonus: float = 0.4
    flow_bonus: float = 0.3
    unclosed_think_penalty: float = 0.3
    min_think_chars: int = 10
    call_reward: float = 0.1
    response_reward: float = 0.3
    correct_bonus: float = 0.5
    # "reference": the reference release's rules (format_reference.py); "credits": paravt's
    # second formula (credit weights above, clip to [0, 1]); "mean": its first, unclipped one.
    format_formula: str = "reference"
    answer_suffix: bool = True  # reference formula: the recipe's answer-suffix credits
    # The tools whose calls earn R_tool (call and response credits, correctness bonus); None:
    # every tool of the toolbox (the default [crop_video]: the paper's rule on crop_video).
    rewarded_tools: tuple[str, ...] | None = None
    # Rollouts of an agent program (rollout.agent_program): train on paravt's R ("paravt"), on
    # the reward the program posted ("agent") or on their sum ("sum").
    agent_reward: str = "paravt"

    def __post_init__(self) -> None:
        if self.agent_reward not in AGENT_REWARDS:
            raise ValueError(
                f"RewardWeights.agent_reward must be one of {', '.join(AGENT_REWARDS)}, "
                f"got {self.agent_reward!r}"
            )
        if self.rewarded_tools is not None:
            names = tuple(self.rewarded_tools)  # Hydra gives a ListConfig
            if not all(isinstance(n, str) and n for n in names):
                raise ValueError(
                    f"RewardWeights.rewarded_tools must be tool names or null, got {names!r}"
                )
            object.__setattr__(self, "rewarded_tools", names)
        if self.format_formula not in FORMULAS:
            raise ValueError(
                f"RewardWeights.format_formula must be one of {', '.join(FORMULAS)}, "
                f"got {self.format_formula!r}"
            )
        for f in fields(self):
            if f.name in ("format_formula", "rewarded_tools", "agent_reward"):
                continue
            if f.name == "answer_suffix":
                if not isinstance(self.answer_suffix, bool):
                    raise ValueError(
                        f"RewardWeights.answer_suffix must be true or false, "
                        f"got {self.answer_suffix!r}"
                    )
                continue
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"RewardWeights.{f.name} must be a finite number, got {value!r}")
        self._check_credit_weights()

    def _check_credit_weights(self) -> None:
        """The reference formula has rules of its own, not credit weights: a changed credit
        weight there would be ignored without a word, so it is refused."""
        changed = [
            name
            for name in CREDIT_WEIGHTS
            if getattr(self, name) != next(f.default for f in fields(self) if f.name == name)
        ]
        if changed and self.format_formula == "reference":
            raise ValueError(
                f"RewardWeights: {', '.join(changed)} set, but the credit weights (think, "
                "answer, order, balance) apply to the 'credits' and 'mean' formulas only, and "
                "format_formula='reference' (the default) ignores them; set "
                "format_formula='credits' (or 'mean') to weight the credits, or format_weight=0 "
                "to turn R_fmt off"
            )


def _format_terms(text: str, w: RewardWeights) -> FormatTerms:
    return format_reward(
        text,
        think_weight=w.think,
        answer_weight=w.answer,
        order_weight=w.order,
        balance_weight=w.balance,
        anchor_weight=w.anchor_weight,
        closed_think_bonus=w.closed_think_bonus,
        flow_bonus=w.flow_bonus,
        unclosed_think_penalty=w.unclosed_think_penalty,
        min_think_chars=w.min_think_chars,
        formula=w.format_formula,
        answer_suffix=w.answer_suffix,
    )


def _components(accuracy: float, fmt: FormatTerms, tool: float) -> dict[str, float]:
    return {"accuracy": accuracy, **fmt.as_dict("format/"), "tool": tool}


def compute_reward(
    text: str,
    gold: str,
    question_type: str,
    *,
    options: Sequence[str] = (),
    num_valid_calls: int | None = None,
    num_tool_responses: int | None = None,
    weights: RewardWeights = RewardWeights(),  # frozen, so one shared default is safe
    judge: Judge | None = None,
    open_ended: str = "f1",
    calls: Sequence[ParsedCall] | None = None,
    tool_results: Sequence[ToolResult] | None = None,
) -> RewardBreakdown:
    """The reward of one trajectory from its own text (every turn, forced prefixes included).

    `text` is the WHOLE trajectory, never an extracted answer: R_fmt reads its tags and R_acc
    extracts the answer itself (`accuracy_reward` scores an already extracted one). R_tool needs
    what the calls did: pass the turn's `calls` (ParsedCall, from the parser) and
    `tool_results` (ToolResult, from the executor), or their counts, always both: a text holding
    a `<tool_call>` with neither, or valid calls without their results, is refused, since R_tool
    would silently be 0 or lack its response credit.
    """
    num_valid_calls, num_tool_responses = _tool_counts(
        text, num_valid_calls, num_tool_responses, calls, tool_results
    )
    if is_degenerate(text):
        zero_fmt = FormatTerms(**{f.name: 0.0 for f in fields(FormatTerms)})
        parts = _components(0.0, zero_fmt, 0.0)
        return RewardBreakdown(
            total=0.0, degenerate=True, components={**parts, "degenerate": 1.0, "total": 0.0}
        )
    accuracy = accuracy_reward(
        extract_answer(text), gold, question_type, options, open_ended=open_ended, judge=judge
    )
    fmt = _format_terms(text, weights)
    tool = tool_reward(
        num_valid_calls,
        num_tool_responses,
        accuracy,
        call_reward=weights.call_reward,
        response_reward=weights.response_reward,
        correct_bonus=weights.correct_bonus,
    )
    total = accuracy + weights.format_weight * fmt.total + weights.tool_weight * tool
    parts = _components(accuracy, fmt, tool)
    return RewardBreakdown(
        total=total,
        accuracy=accuracy,
        format=fmt.total,
        tool=tool,
        components={**parts, "degenerate": 0.0, "total": total},
    )


def _tool_counts(
    text: str,
    num_valid_calls: int | None,
    num_tool_responses: int | None,
    calls: Sequence[ParsedCall] | None,
    tool_results: Sequence[ToolResult] | None,
) -> tuple[int, int]:
    """(valid calls, tool responses) from the counts or from the parsed calls and results."""
    if calls is not None and num_valid_calls is not None:
        raise ValueError("compute_reward: pass calls= or num_valid_calls=, not both")
    if tool_results is not None and num_tool_responses is not None:
        raise ValueError("compute_reward: pass tool_results= or num_tool_responses=, not both")
    valid = sum(c.ok for c in calls) if calls is not None else num_valid_calls
    responses = sum(r.ok for r in tool_results) if tool_results is not None else num_tool_responses
    if valid and responses is None:  # R_tool would silently lose its response credit
        raise ValueError(
            f"compute_reward: {valid} valid calls but nothing says what they returned; pass "
            "tool_results= (the executor's ToolResults) with calls=, or num_tool_responses= "
            "with num_valid_calls= (0 if no call came back)"
        )
    if responses and valid is None:
        raise ValueError(
            f"compute_reward: {responses} tool responses but no calls; pass calls= (the "
            "parser's ParsedCalls) with tool_results=, or num_valid_calls= with "
            "num_tool_responses="
        )
    if valid is None and responses is None and "<tool_call>" in text:
        raise ValueError(
            "compute_reward: the text holds a <tool_call> but R_tool has nothing to read; pass "
            "calls= (the parser's ParsedCalls) and tool_results= (the executor's ToolResults), "
            "or num_valid_calls= and num_tool_responses= (0 and 0 if the calls did nothing)"
        )
    return valid or 0, responses or 0


def is_well_formed(reward: RewardBreakdown) -> bool:
    """A parseable rollout: not degenerate, every tag pair balanced, a non-empty closed answer.

    The structural-token anchor is applied to these rollouts only by default (docs/method.md
    section 4(i); `anchored`).
    """
    parts = reward.components
    return (
        not reward.degenerate
        and parts.get("format/balance", 0.0) >= 1.0
        and parts.get("format/answer", 0.0) >= 1.0
    )


ANCHOR_ROLLOUTS = ("well_formed", "all")


def anchored(rewards: Sequence[RewardBreakdown], rollouts: str = "well_formed") -> list[bool]:
    """Which rollouts the structural anchor reads (`algorithm.anchor_rollouts`): "well_formed"
    (paravt's default: the tags of parseable rollouts only, `is_well_formed`) or "all" (the
    paper's sum over every rollout's structural positions, malformed ones included)."""
    if rollouts not in ANCHOR_ROLLOUTS:
        raise ValueError(
            f"algorithm.anchor_rollouts must be one of {ANCHOR_ROLLOUTS}, got {rollouts!r}"
        )
    return [rollouts == "all" or is_well_formed(r) for r in rewards]


def trajectory_reward(
    traj: Trajectory, sample: Sample, weights: RewardWeights = RewardWeights(), **kwargs
) -> RewardBreakdown:
    """`compute_reward` of a rollout for its sample (text of all turns, its tool counters; with
    `weights.rewarded_tools`, the calls and responses of those tools only)."""
    calls, responses = traj.num_valid_calls, traj.num_tool_responses
    if weights.rewarded_tools is not None:
        named = set(weights.rewarded_tools)
        calls = sum(c.ok and c.call.name in named for t in traj.turns for c in t.calls)
        responses = sum(r.ok and r.name in named for t in traj.turns for r in t.results)
    reward = compute_reward(
        traj.response_text,
        sample.answer,
        sample.question_type,
        options=sample.options,
        num_valid_calls=calls,
        num_tool_responses=responses,
        weights=weights,
        **kwargs,
    )
    return with_agent_reward(reward, traj, weights.agent_reward)


def with_agent_reward(reward: RewardBreakdown, traj: Trajectory, mode: str) -> RewardBreakdown:
    """`reward` with its total as `mode` (`AGENT_REWARDS`) makes it of paravt's R and the
    reward the rollout's agent program posted (kept as the `agent` component)."""
    if mode == "paravt":
        return reward
    if traj.agent_reward is None:
        raise ValueError(
            f"reward.agent_reward={mode}, but the agent program of rollout "
            f"{traj.sample_id}#{traj.group_index} posted no reward: return a number from the "
            "program or POST /v1/episodes/<id>/reward, or set reward.agent_reward=paravt"
        )
    total = AGENT_REWARDS[mode](reward.total, float(traj.agent_reward))
    parts = {**reward.components, "agent": float(traj.agent_reward), "total": total}
    return replace(reward, total=total, components=parts)
