"""The tool-use alarm: fires after `patience` unhealthy steps, names step and figures."""

from __future__ import annotations

import logging

import pytest

from paravt.callbacks.tool_alarm import AlarmState, ToolUseAlarm


def test_fires_once_per_episode_after_patience_steps():
    state = AlarmState(min_kappa=0.5, max_tag_reversion=0.5, patience=2)
    fired = [state.update(s, k, r) for s, (k, r) in enumerate([(0.4, 0), (0.4, 0), (0.4, 0)])]
    assert fired[0] is None and fired[2] is None
    assert fired[1].startswith("tool-use alarm at step 1: kappa 0.400 < min_kappa 0.5 for 2")
    # A healthy step resets the count; tag reversion counts as unhealthy too.
    assert state.update(3, 1.0, 0.0) is None and state.update(4, 1.0, 0.75) is None
    text = state.update(5, 1.0, 0.75)
    assert "step 5: tag reversion 0.750 > max_tag_reversion 0.5" in text


def test_bad_patience_is_named():
    with pytest.raises(ValueError, match=r"tool_alarm\.patience"):
        AlarmState(patience=0)


def test_the_callback_warns_in_a_real_trainer(toy, tmp_path, caplog):
    # The toy rollouts: one of two rollouts per prompt calls the tool, kappa = 0.5 each step.
    alarm = ToolUseAlarm(min_kappa=0.6, max_tag_reversion=None, patience=2)
    with caplog.at_level(logging.WARNING, logger="callbacks.tool_alarm"):
        toy.fit(tmp_path, [alarm], max_steps=3, logger=False)
    assert alarm.warnings == [
        "tool-use alarm at step 1: kappa 0.500 < min_kappa 0.6 for 2 consecutive step(s) (the "
        "policy may be collapsing to answers without tools or to the prior's tags; see "
        "docs/training.md, 'Rollout guards')"
    ]
    assert alarm.warnings[0] in caplog.text


def test_the_alarm_can_watch_one_tool():
    from paravt.types import ParsedCall, ToolCall, Trajectory, Turn

    calls = tuple(
        ParsedCall(i, "<tool_call>", call=ToolCall(n, {})) for i, n in enumerate(["crop_video"] * 2)
    )
    traj = Trajectory(
        "s", 0, (1,), (1,), (0.0,), (), 0, turns=(Turn("x", calls=calls),), num_calls=2
    )
    # two crop_video calls: kappa 2 overall, 0 for zoom (the policy stopped zooming)
    assert ToolUseAlarm().calls(traj) == 2
    assert ToolUseAlarm(tools=["zoom"]).calls(traj) == 0
