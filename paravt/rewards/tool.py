"""The tool-use reward R_tool (docs/method.md section 3).

Our reading of "0 without a parseable call; 0.1 for a call, 0.3 if a tool response was received;
+0.5 more if R_acc > 0" — the levels replace each other, they do not add up:

    no valid call                         -> 0
    a valid call, no tool response        -> call_reward                      (0.1)
    a valid call and a tool response      -> response_reward                  (0.3)
    ... and the answer earns accuracy > 0 -> response_reward + correct_bonus  (0.8)

The correctness bonus needs a received response: it pays for tool use that fed the answer, so a
call whose result never came back earns 0.1 even when the answer is right.

This module deliberately does not count or parse calls itself: the agent loop does, and hands
over plain counts (`Trajectory.num_valid_calls`, `Trajectory.num_tool_responses`).
"""

from __future__ import annotations


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
    if num_tool_responses <= 0:
        return call_reward
    # `accuracy > 0` is False for NaN, so a broken accuracy can never earn the bonus.
    return response_reward + (correct_bonus if accuracy > 0 else 0.0)
