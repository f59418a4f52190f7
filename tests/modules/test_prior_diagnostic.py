"""The pre-RL diagnostic (paravt/run/prior_diagnostic.py): hand-computed rows, and one real run
of the tiny policy through the agent loop."""

from __future__ import annotations

import pytest

from paravt.rewards.compose import RewardBreakdown
from paravt.rl.objective import AdvantageConfig
from paravt.run.prior_diagnostic import diagnostic_rows, diagnostic_table
from paravt.types import ParsedCall, ToolCall, Trajectory, Turn

SHAPING = AdvantageConfig(shaping=True)  # clip((R - 0.2) x 10, +-20)
CALL = (ParsedCall(0, "<tool_call>", call=ToolCall("crop_video", {})),)
REVERTED = "<tool_code>\ncrop_video(start_time=0, end_time=16)\n</tool_code>"


def traj(
    text: str, calls: int = 0, truncated: bool = False, reason: str = "stop", ran: int = 0
) -> Trajectory:
    turns = (Turn(text, calls=CALL),) if calls else (Turn(text),)
    return Trajectory(
        "s", 0, (1,), (1,), (0.0,), (), 0, turns=turns, num_calls=calls, num_valid_calls=ran,
        truncated=truncated, finish_reason=reason,
    )  # fmt: skip


def test_rows_split_tool_and_no_tool_rollouts_by_hand():
    trajs = [
        traj("<answer>B</answer>", calls=2, ran=2),  # tool, right, both crops returned
        traj(REVERTED, calls=1, truncated=True),  # the prior's tag (an error back), cut short
        traj("<answer>B</answer>"),  # no tool, right
        traj("I think", reason="length"),  # no tool, no answer, cut by the token cap
    ]
    rewards = [
        RewardBreakdown(total=2.8, accuracy=1.0),
        RewardBreakdown(total=0.9, accuracy=0.0),
        RewardBreakdown(total=2.0, accuracy=1.0),
        RewardBreakdown(total=0.1, accuracy=0.0),
    ]
    tool, direct = diagnostic_rows(2, trajs, rewards, SHAPING)
    assert (tool.split, tool.rollouts, tool.share, tool.reverted) == ("tool", 2, 0.5, 0.5)
    assert tool.ran == pytest.approx(2 / 3) and direct.ran == 0.0  # 2 of 3 calls; no calls
    assert (tool.accuracy, tool.no_answer, tool.truncated) == (0.5, 0.5, 0.5)
    # raw (2.8 + 0.9) / 2; shaped: 26 -> 20 and 7, so 13.5
    assert tool.reward == pytest.approx(1.85) and tool.shaped == pytest.approx(13.5)
    assert (direct.accuracy, direct.no_answer, direct.truncated) == (0.5, 0.5, 0.5)
    # shaped: 18 and -1
    assert direct.reward == pytest.approx(1.05) and direct.shaped == pytest.approx(8.5)
    unshaped = diagnostic_rows(2, trajs, rewards, AdvantageConfig(shaping=False))
    assert unshaped[0].shaped == pytest.approx(1.85)


def test_an_empty_split_is_zero_and_shows_dashes():
    rows = diagnostic_rows(16, [traj("<answer>B</answer>")], [RewardBreakdown(total=2.0)], SHAPING)
    assert rows[0].rollouts == 0 and rows[0].accuracy == 0.0 and rows[1].share == 1.0
    table = diagnostic_table(rows)
    assert "| 16 | tool | 0 | 0.00 | - | - | - | - | - | - | - |" in table
    assert "| 16 | no tool | 1 | 1.00 |" in table
    with pytest.raises(ValueError, match="1 rewards for 2 rollouts"):
        diagnostic_rows(2, [traj("x"), traj("y")], [RewardBreakdown(total=0.0)], SHAPING)


def test_the_diagnostic_runs_the_tiny_policy_through_the_agent(tiny_qwen3_dir, needle_samples):
    import torch

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.models.loading import PolicySpec, load_policy
    from paravt.rewards.compose import trajectory_reward
    from paravt.rollout.engines.hf import TransformersEngine
    from paravt.run.prior_diagnostic import run_diagnostic
    from paravt.video.reader import VideoReader

    torch.manual_seed(0)
    model, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir), freeze_vision=True))

    class Host:  # what the diagnostic needs of the GRPO module
        policy, policy_version = model, 0

        def score(self, t, sample):
            return trajectory_reward(t, sample)

    cfg = AgentConfig(max_rounds=1, max_new_tokens=16, system="compact", tool_dialect="tool_call")
    agent = AgentLoop(TransformersEngine(model, processor.tokenizer), ChatRenderer(processor),
                      VideoReader(), cfg)  # fmt: skip
    rows = run_diagnostic(Host(), agent, needle_samples, SHAPING, budgets=(2, 4), prompts=2,
                          group_size=2)  # fmt: skip
    assert [(r.budget, r.split) for r in rows] == [(2, "tool"), (2, "no tool"), (4, "tool"),
                                                   (4, "no tool")]  # fmt: skip
    for k in (0, 2):  # 2 prompts x 2 rollouts at each budget, split in two
        assert rows[k].rollouts + rows[k + 1].rollouts == 4
        assert rows[k].share + rows[k + 1].share == pytest.approx(1.0)
    # a random tiny policy with 16 tokens a turn: no closed answer, stopped by the token cap
    assert all(r.no_answer == 1.0 and r.truncated == 1.0 for r in rows if r.rollouts)
