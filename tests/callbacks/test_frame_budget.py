"""FrameBudgetGating in a real Trainer, and its gate metrics computed by hand."""

from __future__ import annotations

import re
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from paravt.callbacks.frame_budget import (
    FrameBudgetGating,
    FrameBudgetRandomization,
    GateRecord,
    budget_metrics,
    merge_gate_stats,
    step_gate_stats,
)
from paravt.callbacks.records import RolloutRecord
from paravt.rl.budget import FrameBudgetSampler, GateStat
from paravt.types import RewardBreakdown


def _group(toy, pid, tool_reward, free_reward, tool=True):
    """Rollout 0 calls the tool when `tool` (else both skip it); rewards as given."""
    crops = [(1.0, 2.0)] if tool else []
    trajectories = [toy.trajectory(pid, 0, crops=crops), toy.trajectory(pid, 1)]
    return trajectories, [RewardBreakdown(tool_reward), RewardBreakdown(free_reward)]


def _record(groups, budgets, step=0):
    trajectories = [t for ts, _ in groups for t in ts]
    rewards = [r for _, rs in groups for r in rs]
    n = len(budgets)
    return RolloutRecord(step, trajectories, rewards, 2, budgets, [()] * n, [60.0] * n)


def test_budget_metrics_by_hand(toy):
    groups = [
        _group(toy, "a", 1.0, 0.0),  # K=4: tool 1.0 > free 0.0 -> a win
        _group(toy, "b", 0.0, 0.0, tool=False),  # K=4: no tool rollout -> undefined
        _group(toy, "c", 0.2, 0.5),  # K=64: tool 0.2 < free 0.5 -> defined, no win
    ]
    record = _record(groups, [4, 4, 64])
    assert budget_metrics(step_gate_stats(record), record.budgets) == {
        "gate_ratio/K4": 1.0,  # 1 win / 1 defined group
        "gate_undefined/K4": 1.0,
        "gate_ratio/K64": 0.0,  # 0 wins / 1 defined group
        "gate_undefined/K64": 0.0,
        "frame_budget/mean": 24.0,  # (4 + 4 + 64) / 3
    }


def test_budget_without_defined_groups_logs_no_ratio(toy):
    record = _record([_group(toy, "a", 1.0, 1.0, tool=False)], [8])
    metrics = budget_metrics(step_gate_stats(record), record.budgets)
    assert metrics == {"gate_undefined/K8": 1.0, "frame_budget/mean": 8.0}


def test_merge_pools_groups_across_steps():
    first = {4: GateStat(wins=1, defined=1, undefined=1, ratio=1.0)}
    second = {
        4: GateStat(wins=0, defined=1, undefined=0, ratio=0.0),
        64: GateStat(wins=0, defined=0, undefined=2, ratio=0.0),
    }
    assert merge_gate_stats([second, first]) == {
        4: GateStat(wins=1, defined=2, undefined=1, ratio=0.5),  # (1 + 0) / (1 + 1)
        64: GateStat(wins=0, defined=0, undefined=2, ratio=0.0),
    }
    assert merge_gate_stats([]) == {}


def test_installs_the_sampler_in_the_datamodule(tmp_path, toy):
    # One budget: every prompt must get 8, never the DataModule's own default of 64.
    _, module, _ = toy.fit(tmp_path, [FrameBudgetGating(frame_budgets=[8])])
    assert [s["budgets"] for s in module.seen] == [[8, 8], [8, 8], [8, 8]]


def _budget_scenario(toy):
    """Tool use wins when K <= 16 and loses at K = 64; prompt p3 never calls the tool."""

    def scenario(step, ids, budgets):
        groups = [
            _group(toy, pid, 1.0 if k <= 16 else 0.0, 0.5, tool=pid != "p3")
            for pid, k in zip(ids, budgets, strict=True)
        ]
        return _record(groups, budgets, step)

    return scenario


def _expected(ids, ks):
    """What _budget_scenario's groups must log, by its rule, one group at a time."""
    wins, defined, undefined = {}, {}, {}
    for pid, k in zip(ids, ks, strict=True):
        for table in (wins, defined, undefined):
            table.setdefault(k, 0)
        if pid == "p3":
            undefined[k] += 1
        else:
            defined[k] += 1
            wins[k] += k <= 16
    metrics = {f"gate_undefined/K{k}": float(n) for k, n in undefined.items()}
    metrics.update({f"gate_ratio/K{k}": wins[k] / n for k, n in defined.items() if n})
    metrics["frame_budget/mean"] = sum(ks) / len(ks)
    return metrics


# 4 prompts, batch 2: steps 0 and 1 are epoch 0, step 2 starts epoch 1 with p0, p1.
BATCHES = [(["p0", "p1"], 0), (["p2", "p3"], 0), (["p0", "p1"], 1)]


def _logged(toy, log_dir):
    """step -> {tag: value} of every budget scalar in the event files."""
    events = toy.read_events(log_dir)
    logged: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        if tag.startswith(("gate_", "frame_budget")):
            for step, value in toy.scalars(events, tag).items():
                logged.setdefault(step, {})[tag] = value
    return logged


@pytest.mark.parametrize(
    ("log_every", "flushes"),
    [
        (1, [[0], [1], [2]]),  # every step on its own
        (2, [[0, 1], [2]]),  # steps 0-1 pooled at step 1; step 2 flushed by on_train_end
    ],
)
def test_logs_gate_ratio_per_budget_to_tensorboard(tmp_path, toy, log_every, flushes):
    budgets, seed = (4, 16, 64), 3
    module = toy.Module(scenario=_budget_scenario(toy))
    callback = FrameBudgetGating(budgets, seed=seed)
    trainer, module, log_dir = toy.fit(
        tmp_path, [callback], module=module, log_every_n_steps=log_every
    )
    sampler = FrameBudgetSampler(budgets, seed=seed)
    ks = [[sampler.budget(p, epoch) for p in ids] for ids, epoch in BATCHES]
    assert [s["budgets"] for s in module.seen] == ks
    expected = {
        steps[-1]: _expected(
            [p for s in steps for p in BATCHES[s][0]], [k for s in steps for k in ks[s]]
        )
        for steps in flushes
    }
    assert _logged(toy, log_dir) == expected  # 0, 1 and halves: exact in float32
    # Monitorable: the last in-step flush is in callback_metrics (ModelCheckpoint, EarlyStopping).
    last = [f[-1] for f in flushes if (f[-1] + 1) % log_every == 0][-1]
    monitored = {k: float(trainer.callback_metrics[k]) for k in expected[last]}
    assert monitored == pytest.approx(expected[last])


def test_nothing_is_logged_without_a_rollout(tmp_path, toy):
    module = toy.Module(scenario=lambda step, ids, budgets: None)
    _, _, log_dir = toy.fit(tmp_path, [FrameBudgetGating()], module=module)
    assert not [t for t in toy.read_events(log_dir).Tags()["scalars"] if "budget" in t]


def _fit_plain(toy, callback, collate):
    """A real Trainer on a plain DataLoader (no DataModule); the FrameBudgetGating warnings."""
    trainer = pl.Trainer(
        max_steps=2,
        logger=False,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(["p0", "p1"], batch_size=1, collate_fn=collate)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(toy.Module(), train_dataloaders=loader)
    return [str(w.message) for w in caught if "FrameBudgetGating" in str(w.message)]


def test_plain_dataloaders_use_the_sampler_hook_without_a_warning(toy):
    callback = FrameBudgetGating(frame_budgets=[4, 8], seed=3)
    drawn = []

    def collate(ids):  # the documented hook: the sampler, where the batch is built
        drawn.extend(callback.sampler.budget(i, 0) for i in ids)
        return ids, drawn[-len(ids) :]

    assert _fit_plain(toy, callback, collate) == []  # the documented path is quiet
    assert drawn == [FrameBudgetSampler((4, 8), None, 3).budget(p, 0) for p in ("p0", "p1")]


@pytest.mark.parametrize(
    ("budget", "why"),
    [(4, r"no budget was drawn from frame_budgets \[4, 8\]"), (16, r"budgets \[16\] are not")],
)
def test_plain_dataloaders_without_the_hook_are_warned_once(toy, budget, why):
    callback = FrameBudgetGating(frame_budgets=[4, 8], seed=3)
    # K fixed by hand, never drawn with callback.sampler.budget: the gate would log budgets the
    # callback did not choose. A K of 16 is not even among its frame budgets.
    messages = _fit_plain(toy, callback, lambda ids: (ids, [budget] * len(ids)))
    assert len(messages) == 1 and re.search(why, messages[0]), messages
    assert "callback.sampler.budget(prompt_id, epoch)" in messages[0]


def test_a_light_gate_record_is_enough():
    gate = GateRecord(
        step=0,
        rewards=torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        tool_calls=torch.tensor([[2, 0], [1, 0]]),
        budgets=(4, 8),
    )
    # Group 0 (K=4): the tool-using rollout out-scores the tool-free one; group 1 (K=8): not.
    stats = step_gate_stats(gate)
    assert (stats[4].wins, stats[4].defined, stats[8].wins, stats[8].defined) == (1, 1, 0, 1)
    with pytest.raises(ValueError, match=r"budgets \[B\]"):
        GateRecord(0, torch.zeros(2, 2), torch.zeros(2, 2), (4,))


def test_needs_the_budget_sink_protocol(tmp_path, toy):
    class NoSink(toy.DataModule):
        set_budget_sampler = None  # not callable: no BudgetSink

    with pytest.raises(TypeError, match=r"NoSink does not implement .*BudgetSink"):
        toy.fit(tmp_path, [FrameBudgetGating()], datamodule=NoSink())


def test_without_last_rollout_the_gate_is_skipped_with_a_warning(tmp_path, toy):
    module = toy.Module()
    module.scenario = lambda step, ids, budgets: None
    del module.last_rollout
    module.training_step = _without_record(module)
    with pytest.warns(UserWarning, match="ToyModule has no `last_rollout`"):
        _, _, log_dir = toy.fit(tmp_path, [FrameBudgetGating()], module=module)
    assert not [t for t in toy.read_events(log_dir).Tags()["scalars"] if "gate" in t]


def _without_record(module):
    """A training step that never sets last_rollout (the contract broken)."""

    def training_step(batch, batch_idx):
        return module.layer(module.layer.weight.new_ones(1, 2)).pow(2).sum()

    return training_step


def test_bad_budgets_fail_at_construction():
    with pytest.raises(ValueError, match="positive int"):
        FrameBudgetGating(frame_budgets=(4, 0))
    with pytest.raises(ValueError, match="weights has 1 entries but there are 2 budgets"):
        FrameBudgetGating(frame_budgets=(4, 8), weights=(1.0,))


@pytest.mark.parametrize("cls", [FrameBudgetGating, FrameBudgetRandomization])
@pytest.mark.parametrize("keyword", ["frame_budgets", "budgets"])
def test_both_names_take_both_keywords(cls, keyword):
    # The former name with the new keyword and the new name with the former keyword
    # (`FrameBudgetGating(budgets=[2, 16])` raised TypeError) build the same gating.
    made = cls(**{keyword: [2, 16]}, weights=[3.0, 1.0], seed=5)
    new = FrameBudgetGating(frame_budgets=[2, 16], weights=[3.0, 1.0], seed=5)
    assert isinstance(made, FrameBudgetGating) and made.sampler == new.sampler
    assert made.sampler.budgets == (2, 16)
    assert FrameBudgetGating([2, 16]).sampler.budgets == (2, 16)  # positional, as before


def test_both_keywords_at_once_are_refused():
    with pytest.raises(TypeError, match=r"pass frame_budgets= only \(budgets= is its former"):
        FrameBudgetGating(frame_budgets=[2], budgets=[4])
