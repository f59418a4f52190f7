"""The embedded demo's config does what docs/training.md says: its cold-start teacher mixes
strategies in the stated shares per frame budget, and its crops show the needle while its
overviews are sparse. Runs the real agent loop with the scripted teacher on a few videos
generated with the demo's own data settings (no model is trained)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from paravt.run.coldstart import ColdStartConfig, mixed_plan, teacher_trajectories
from paravt.types import Sample

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def demo_cfg():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=["run_dir=unused"])  # experiment=demo is the default


def test_the_default_run_is_the_demo_with_an_imperfect_teacher(demo_cfg):
    assert demo_cfg.name == "demo"
    cs = instantiate(demo_cfg.cold_start)
    assert isinstance(cs, ColdStartConfig)
    low, high = sorted(cs.frame_budgets)
    # The teacher crops at the lower budget more often than it answers from the overview, and
    # the other way round at the higher one: RL has a tool-use decision to improve.
    share = {k: mix["search"] / sum(mix.values()) for k, mix in cs.teacher_mix.items()}
    assert share[low] > 0.5 > share[high] > 0
    assert 0 < cs.oracle_steps < cs.steps
    assert list(demo_cfg.callbacks.frame_budget_gating.frame_budgets) == list(cs.frame_budgets)
    assert demo_cfg.callbacks.benchmark_validation.limit >= 48
    assert demo_cfg.data.generate.num_eval >= demo_cfg.callbacks.benchmark_validation.limit


def test_mixed_plan_has_the_configured_shares_at_every_budget(demo_cfg):
    cs = instantiate(demo_cfg.cold_start)
    samples = [Sample(f"s{i}", "", "Q", "A") for i in range(48)]
    budgets = [cs.frame_budgets[i % len(cs.frame_budgets)] for i in range(len(samples))]
    plan = mixed_plan(samples, budgets, cs)
    for k, mix in cs.teacher_mix.items():
        got = [plan[s.id] for s, b in zip(samples, budgets, strict=True) if b == k]
        for name, weight in mix.items():
            want = len(got) * weight / sum(mix.values())
            assert abs(got.count(name) - want) < 1, (k, name, got.count(name), want)


@pytest.fixture(scope="module")
def demo_samples(demo_cfg, tmp_path_factory):
    from paravt.data.datasets import load_samples
    from paravt.video.synthetic import NeedleConfig, generate

    gen = OmegaConf.to_container(demo_cfg.data.generate, resolve=True)
    gen.pop("out_dir")
    gen.update(num_train=8, num_eval=0)
    gen["families"] = tuple(tuple(f) for f in gen["families"])
    out = tmp_path_factory.mktemp("needle_demo")
    generate(NeedleConfig(**gen), out)
    samples, _ = load_samples(out / "train.jsonl")
    return samples


def test_the_teacher_mix_crops_the_needle_or_answers_at_once(
    demo_cfg, demo_samples, tiny_qwen3_dir
):
    from transformers import AutoProcessor

    from paravt.agent.loop import AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    rollout = instantiate(demo_cfg.rollout)
    renderer = ChatRenderer(processor)
    engine = ScriptedEngine(processor.tokenizer, lambda context: "unused")
    agent = AgentLoop(engine, renderer, VideoReader(), rollout.agent, rollout.crop)
    cs = instantiate(demo_cfg.cold_start)
    trajs = teacher_trajectories(agent, demo_samples, cs)
    budgets = [cs.frame_budgets[i % len(cs.frame_budgets)] for i in range(len(demo_samples))]
    plan = mixed_plan(demo_samples, budgets, cs)
    assert {"search", "direct"} <= set(plan.values())
    for s, t, k in zip(demo_samples, trajs, budgets, strict=True):
        assert t.frame_budget == k and t.response_text.endswith(f"<answer>{s.answer}</answer>")
        if plan[s.id] == "direct":
            assert t.num_calls == 0 and t.num_tool_responses == 0
            continue
        assert t.num_valid_calls == t.num_tool_responses >= 2  # parallel crops, one turn
        assert t.num_rounds == 1
        (lo, hi), *_ = s.windows
        seen = [ts for turn in t.turns for r in turn.results if r.ok for ts in r.frames.timestamps]
        assert any(lo <= ts < hi for ts in seen), (s.id, s.windows, seen)  # crops show it


PRIOR_ARMS = ("paragrpo", "grpo", "anchoring_only", "gating_only", "no_tool_reward", "weak")
# the factorial's vanilla-prompt arms (docs/paradox.md) -> their only differences from
# demo_prior_grpo, by hand: the anchor's two knobs at demo_prior_paragrpo's values (0.1, 0.5),
# its gating ({2, 4, 8, 16}), its forced <think> and its answer-suffix credits
_ANCHOR = {"algorithm.anchor_coef": (0.0, 0.1), "reward.anchor_weight": (0.0, 0.5)}
_GATING = {"callbacks.frame_budget_gating": (None, [2, 4, 8, 16])}
_THINK = {"rollout.agent.force_think": (False, True)}
_SUFFIX = {"reward.answer_suffix": (False, True)}
FACTORIAL = {
    "grpo_anchor": _ANCHOR,
    "grpo_gating": _GATING,
    "grpo_anchor_gating": {**_ANCHOR, **_GATING},
    "grpo_think_suffix": {**_THINK, **_SUFFIX},
    "grpo_think": _THINK,
    "grpo_suffix": _SUFFIX,
}
PRIOR_ARMS += tuple(FACTORIAL)


@pytest.fixture(scope="module")
def prior_arms():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return {
            arm: compose("train", overrides=["run_dir=unused", f"experiment=demo_prior_{arm}"])
            for arm in PRIOR_ARMS
        }


def test_vanilla_grpo_arm_gets_r_tool_as_the_reference(prior_arms):
    """The reference's vanilla recipe adds R_tool with weight 1; only the no-R_tool arm drops it."""
    from paravt.rewards.compose import RewardWeights
    from paravt.rewards.tool import tool_reward

    for arm, cfg in prior_arms.items():
        w = instantiate(cfg.reward)
        assert isinstance(w, RewardWeights)
        assert w.tool_weight == (0.0 if arm == "no_tool_reward" else 1.0), arm
        kw = {"call_reward": w.call_reward, "response_reward": w.response_reward}
        kw["correct_bonus"] = w.correct_bonus
        # a correct answer after a call that failed: 0.1 + 0.5; after one that ran: 0.3 + 0.5
        assert tool_reward(1, 0, 1.0, **kw) == pytest.approx(0.6), arm
        assert tool_reward(1, 1, 1.0, **kw) == pytest.approx(0.8), arm


def test_every_paradox_arm_shapes_rewards_as_the_reference(prior_arms):
    import torch

    from paravt.rl.objective import AdvantageConfig, compute_advantages

    for arm, cfg in prior_arms.items():
        adv = instantiate(cfg.algorithm.advantage)
        assert isinstance(adv, AdvantageConfig)
        # the reference's _base.yaml (both recipes): reward_bias -0.2, reward_scaling 10,
        # reward_clip 20 (AReaL's default), group then batch normalisation
        assert (adv.shaping, adv.shaping_shift, adv.shaping_scale, adv.shaping_clip) == (
            True, -0.2, 10.0, 20.0,
        ), arm  # fmt: skip
        assert adv.batch_norm, arm
    # a correct tool answer (1 + 1 + 0.8), a correct direct one (1 + 1), a wrong direct one
    # (0 + 0.8), nothing: (R - 0.2) x 10 = 26 -> 20, 18, 6, -2
    from paravt.rl.advantages import shape_rewards

    shaped = shape_rewards(torch.tensor([2.8, 2.0, 0.8, 0.0]), 10.0, -0.2, 20.0)
    assert shaped.tolist() == pytest.approx([20.0, 18.0, 6.0, -2.0])
    # the clip leaves the tool answer 2 above the direct one instead of 8
    unshaped = AdvantageConfig(shaping=False, batch_norm=False)
    raw = compute_advantages(torch.tensor([[2.8, 2.0, 0.8, 0.0]]), unshaped)
    shaped_adv = compute_advantages(torch.tensor([[2.8, 2.0, 0.8, 0.0]]), adv).values
    assert raw.values[0] - raw.values[1] > 2 * (shaped_adv[0] - shaped_adv[1])


def test_the_paradox_arms_share_one_prior_and_differ_as_documented(prior_arms):
    from paravt.run.build import prior_key_parts
    from paravt.run.prior import stages_key

    keys = {
        arm: stages_key(instantiate(cfg.prior), prior_key_parts(cfg))
        for arm, cfg in prior_arms.items()
    }
    assert len({keys[arm] for arm in PRIOR_ARMS if arm != "weak"}) == 1
    assert keys["weak"] != keys["paragrpo"]
    weak, para, grpo = prior_arms["weak"], prior_arms["paragrpo"], prior_arms["grpo"]
    assert (weak.prior.steps, weak.prior.tool_share) == (para.prior.steps, 0.0)
    # the weak prior reads without tools: every step its curriculum, overviews that show the
    # needle at the fewest of K = 2-16 frames that do (16 shows it in every demo video)
    assert weak.prior.oracle_steps == weak.prior.steps
    assert list(weak.prior.frame_budgets) == [2, 4, 8, 16]
    assert (para.prior.steps, para.prior.tool_share) == (140, 0.8)
    budgets = list(para.prior.frame_budgets)
    assert {k: budgets.count(k) for k in set(budgets)} == {2: 2, 4: 2, 16: 1}
    # the cold start's own schedule (not the demo's 16 warm-up steps), the tower frozen, and
    # half of its examples the prior's corpus
    cold = para.cold_start
    assert cold.warmup_steps <= cold.steps // 10 and not cold.train_vision
    assert cold.prior_replay == 0.5
    for cfg in prior_arms.values():
        assert (cfg.rollout.crop.sample_fps, cfg.rollout.crop.max_frames) == (1.0, 16)
        assert cfg.rollout.agent.tool_dialect == "tool_call"
        assert (cfg.rollout.group_size, cfg.data.batch_size, cfg.trainer.max_steps) == (8, 4, 60)
    # vanilla GRPO: the reference's vanilla recipe, no think prefix, default format credits
    assert not grpo.rollout.agent.force_think and not grpo.reward.answer_suffix
    assert para.rollout.agent.force_think and para.reward.answer_suffix


def _leaves(node, prefix=""):
    """{dotted key: value} of a resolved config; the gating callback reads as its budgets."""
    if prefix == "callbacks.frame_budget_gating." and isinstance(node, dict):
        return {prefix[:-1]: node["frame_budgets"]}
    if isinstance(node, dict):
        pairs = (_leaves(sub, f"{prefix}{key}.").items() for key, sub in node.items())
        return {k: v for items in pairs for k, v in items}
    return {prefix[:-1]: node}


def test_each_factorial_arm_differs_from_vanilla_grpo_in_its_knobs_only(prior_arms):
    """Compared unresolved: an interpolation of a knob (the anchor curriculum's `start`) is the
    knob itself, not a second difference."""

    def leaves(arm):
        return _leaves(OmegaConf.to_container(prior_arms[arm], resolve=False))

    base, para = leaves("grpo"), leaves("paragrpo")
    for arm, knobs in FACTORIAL.items():
        cfg = leaves(arm)
        assert cfg.pop("name") == f"demo_prior_{arm}" and base["name"] == "demo_prior_grpo"
        keys = (set(cfg) | set(base)) - {"name"}
        diff = {k: (base.get(k), cfg.get(k)) for k in keys if base.get(k) != cfg.get(k)}
        assert diff == knobs, arm
        assert all(para[k] == new for k, (_, new) in knobs.items()), arm  # PARA-GRPO's values


def test_the_documented_factorial_command_runs_every_arm():
    """docs/paradox.md's one `train.py -m` command names the factorial's every arm, the
    report's groups (PARA-GRPO's prompt arms and the weak prior included), seeds outermost so
    that each seed's prior is built once; Hydra's sweep writes the report's run folders."""
    from paravt.run.paradox_report import GROUPS

    text = (CONF.parent / "docs" / "paradox.md").read_text()
    (command,) = re.findall(r"^python train\.py -m .*$", text, re.M)
    pattern = r"python train\.py -m (seed=\S+) experiment=(\S+)"
    seeds, experiments = re.fullmatch(pattern, command).groups()
    assert seeds == "seed=0,1,2,3"
    report = [f"demo_prior_{arm}" for _, arms in GROUPS for arm, *_ in arms]
    assert experiments.split(",") == report
    assert {f"demo_prior_{arm}" for arm in PRIOR_ARMS} == set(report)
    sweep = compose_sweep("experiment=demo_prior_grpo_think", "seed=3")
    assert (sweep.dir, sweep.subdir) == ("runs", "demo_prior_grpo_think_seed3")


def compose_sweep(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["run_dir=unused", *overrides], return_hydra_config=True)
    return cfg.hydra.sweep


def test_the_default_demo_keeps_its_crops_and_dialect(demo_cfg):
    assert (demo_cfg.rollout.crop.sample_fps, demo_cfg.rollout.crop.max_frames) == (0.5, 8)
    assert demo_cfg.rollout.agent.tool_dialect == "any"
    assert demo_cfg.get("prior") is None
