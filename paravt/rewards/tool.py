"""The tool-use reward R_tool (docs/method.md section 3), as the reference release computes it.

The reference's rule (its `paravt/rl/rewards/tool.py`): 0 without a parseable call; otherwise 0.1
for the call, raised to 0.3 when a tool response came back; then 0.5 more whenever R_acc > 0,
with or without a response; the sum capped at 1. Once per trajectory, however many calls:

    no valid call                         -> 0
    a valid call, no tool response        -> call_reward                      (0.1)
    a valid call and a tool response      -> response_reward                  (0.3)
    ... and the answer earns accuracy > 0 -> that level + correct_bonus       (0.6 or 0.8)

The bonus rewards any answer with R_acc > 0 (a partial F1 or IoU too) once a call was made; it
does not check that the call's result fed the answer, nor the frame budget.

This module deliberately does not count or parse calls itself: the agent loop does, and hands
over plain counts (`Trajectory.num_valid_calls`, `Trajectory.num_tool_responses`).
"""

from __future__ import annotations

MAX_TOOL_REWARD = 1.0  # the reference's cap; reached only with larger coefficients than its own


def tool_reward(
    num_valid_calls: int,
    num_tool_responses: int,
    accuracy: float,
    *,
    call_reward: float = 0.1,
    response_reward: float = 0.3,
    correct_bonus: float = 0.5,
) -> float:
    """R_tool of one trajectory from its call and response counts and its R_acc."""
    if num_valid_calls <= 0:
        return 0.0
    level = response_reward if num_tool_responses > 0 else call_reward
    # `accuracy > 0` is False for NaN, so a broken accuracy can never earn the bonus.
    bonus = correct_bonus if accuracy > 0 else 0.0
    return min(level + bonus, MAX_TOOL_REWARD)
