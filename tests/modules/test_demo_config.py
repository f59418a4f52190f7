"""The embedded demo's config does what docs/demo.md says: its cold-start teacher mixes strategies
in the stated shares per frame budget, and its crops show the needle while its overviews are
sparse. Runs the real agent loop with the scripted teacher on a few videos generated with the
demo's own data settings (no model is trained)."""

from __future__ import annotations

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
    low, high = sorted(cs.budgets)
    # The teacher crops at the lower budget more often than it answers from the overview, and
    # the other way round at the higher one: RL has a tool-use decision to improve.
    share = {k: mix["search"] / sum(mix.values()) for k, mix in cs.teacher_mix.items()}
    assert share[low] > 0.5 > share[high] > 0
    assert 0 < cs.oracle_steps < cs.steps
    assert list(demo_cfg.callbacks.frame_budget.budgets) == list(cs.budgets)
    assert demo_cfg.callbacks.benchmark_validation.limit >= 48
    assert demo_cfg.data.generate.num_eval >= demo_cfg.callbacks.benchmark_validation.limit


def test_mixed_plan_has_the_configured_shares_at_every_budget(demo_cfg):
    cs = instantiate(demo_cfg.cold_start)
    samples = [Sample(f"s{i}", "", "Q", "A") for i in range(48)]
    budgets = [cs.budgets[i % len(cs.budgets)] for i in range(len(samples))]
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
    from paravt.rollout.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    rollout = instantiate(demo_cfg.rollout)
    renderer = ChatRenderer(processor)
    engine = ScriptedEngine(processor.tokenizer, lambda context: "unused")
    agent = AgentLoop(engine, renderer, VideoReader(), rollout.agent, rollout.crop)
    cs = instantiate(demo_cfg.cold_start)
    trajs = teacher_trajectories(agent, demo_samples, cs)
    budgets = [cs.budgets[i % len(cs.budgets)] for i in range(len(demo_samples))]
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
