"""FormatAnchorCurriculum in a real Trainer (what the training step sees and what is logged) and
on the real GRPOModule."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from paravt.callbacks.format_anchor import ANCHOR_KEY, FORMAT_KEY, FormatAnchorCurriculum
from paravt.models.loading import PolicySpec
from paravt.modules.grpo import GRPOModule
from paravt.rewards.compose import RewardWeights
from paravt.rl.algorithm import AlgorithmConfig

LINEAR = {"kind": "linear", "start": 1.0, "end": 0.0, "steps": 2}
STEP = {"kind": "step", "start": 0.0, "milestones": [1], "values": [0.25]}


@pytest.mark.parametrize("manual", [False, True])
def test_training_step_sees_the_scheduled_values(tmp_path, toy, manual):
    callback = FormatAnchorCurriculum(format_schedule=LINEAR, anchor_schedule=STEP)
    _, module, log_dir = toy.fit(tmp_path, [callback], module=toy.Module(manual=manual))
    # format: 1 + (0 - 1) * min(step / 2, 1) -> 1.0, 0.5, 0.0
    # anchor: 0.0 before milestone 1, then 0.25
    assert [(s["step"], s["fmt"], s["anchor"]) for s in module.seen] == [
        (0, 1.0, 0.0),
        (1, 0.5, 0.25),
        (2, 0.0, 0.25),
    ]
    # Every other reward weight is left as it was.
    assert module.reward_weights == replace(RewardWeights(), format_weight=0.0)
    events = toy.read_events(log_dir)
    assert toy.scalars(events, FORMAT_KEY) == {0: 1.0, 1: 0.5, 2: 0.0}
    assert toy.scalars(events, ANCHOR_KEY) == {0: 0.0, 1: 0.25, 2: 0.25}


def test_anchor_only_leaves_the_reward_weights_alone(tmp_path, toy):
    module = toy.Module()
    custom = replace(RewardWeights(), format_weight=0.7)
    module.reward_weights = custom
    callback = FormatAnchorCurriculum(anchor_schedule={"kind": "constant", "start": 0.05})
    _, module, log_dir = toy.fit(tmp_path, [callback], module=module)
    assert [s["fmt"] for s in module.seen] == [0.7, 0.7, 0.7]
    assert [s["anchor"] for s in module.seen] == [0.05, 0.05, 0.05]
    assert module.reward_weights is custom
    tags = toy.read_events(log_dir).Tags()["scalars"]
    assert ANCHOR_KEY in tags and FORMAT_KEY not in tags


def test_values_at_follows_the_step():
    callback = FormatAnchorCurriculum(
        format_schedule={"kind": "cosine", "start": 1.0, "end": 0.5, "steps": 2}
    )
    # 0.5 + (1.0 - 0.5) * 0.5 * (1 + cos(pi / 2)) = 0.75
    assert callback.values_at(1) == {FORMAT_KEY: pytest.approx(0.75)}


def test_needs_at_least_one_schedule():
    with pytest.raises(ValueError, match="needs format_schedule, anchor_schedule or both"):
        FormatAnchorCurriculum()


def test_bad_schedule_fails_at_construction_and_names_it():
    with pytest.raises(
        ValueError, match=r"anchor_schedule: kind 'linear' needs \['end', 'steps'\]"
    ):
        FormatAnchorCurriculum(anchor_schedule={"kind": "linear", "start": 1.0})


def test_module_without_the_anchor_protocol_is_named(tmp_path, toy):
    class NoAnchor(toy.Module):
        set_anchor_coef = None  # not callable: the module does not implement AnchorWeighted

    with pytest.raises(TypeError, match=r"needs NoAnchor to implement .*AnchorWeighted"):
        toy.fit(tmp_path, [FormatAnchorCurriculum(anchor_schedule=STEP)], module=NoAnchor())


def test_module_without_the_format_protocol_is_named(tmp_path, toy):
    class NoFormat(toy.Module):
        set_format_weight = None

    with pytest.raises(TypeError, match=r"format_schedule needs NoFormat .*FormatWeighted"):
        toy.fit(tmp_path, [FormatAnchorCurriculum(format_schedule=LINEAR)], module=NoFormat())


def test_a_module_with_only_the_schedules_protocol_is_enough(tmp_path, toy):
    class NoFormat(toy.Module):
        set_format_weight = None

    _, module, _ = toy.fit(
        tmp_path, [FormatAnchorCurriculum(anchor_schedule=STEP)], module=NoFormat()
    )
    assert [s["anchor"] for s in module.seen] == [0.0, 0.25, 0.25]


def test_the_real_grpo_module_follows_the_schedules(tiny_qwen3_dir, monkeypatch):
    """The hooks on `GRPOModule` itself (the tiny model, no reference copy): the reward weights
    and anchor coefficient its step reads, and its checkpoint, follow the schedules. A stand-in
    for the Trainer gives the hooks `global_step` only; the logging is checked above with a
    real Trainer."""
    reward = replace(RewardWeights(), format_weight=0.6)
    module = GRPOModule(
        model=PolicySpec(path=str(tiny_qwen3_dir)),
        algorithm=AlgorithmConfig(kl_coef=0.0, anchor_coef=0.1),
        reward=reward,
        optimizer=lambda params: None,  # never called: no optimizer step is taken
    )
    logged = []
    monkeypatch.setattr(module, "log_dict", lambda values, **_: logged.append(values))
    callback = FormatAnchorCurriculum(format_schedule=LINEAR, anchor_schedule=STEP)
    trainer = SimpleNamespace(global_step=0)
    callback.setup(trainer, module, "fit")  # GRPOModule has both Protocols: no error
    seen = []
    for step in range(3):
        trainer.global_step = step
        callback.on_train_batch_start(trainer, module, batch=None, batch_idx=step)
        seen.append((module.reward_weights.format_weight, module.anchor_coef))  # each call's
    # format: 1 + (0 - 1) * min(step / 2, 1); anchor: 0.0 before milestone 1, then 0.25
    assert seen == [(1.0, 0.0), (0.5, 0.25), (0.0, 0.25)]
    assert module.reward_weights == replace(reward, format_weight=0.0)  # the rest untouched
    assert logged[-1] == {FORMAT_KEY: 0.0, ANCHOR_KEY: 0.25}
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)  # a resumed run continues from the scheduled values
    saved = checkpoint["paravt"]
    assert (saved["reward_weights"]["format_weight"], saved["anchor_coef"]) == (0.0, 0.25)
