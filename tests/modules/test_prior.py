"""The tool prior stage (paravt/run/prior.py) on the real tiny model and needle videos."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from paravt.run.prior import PriorConfig, cache_key, prior_dialect


def test_prior_dialect_rewrites_calls_into_tool_code():
    from paravt.agent.scripts import call_text

    turn = f"The frames are too sparse.</think>\n{call_text(0, 16)}\n{call_text(16, 32.0)}"
    out = prior_dialect(turn)
    assert "<tool_call>" not in out
    lines = "crop_video(start_time=0, end_time=16)\ncrop_video(start_time=16, end_time=32.0)"
    assert out.endswith(f"<tool_code>\n{lines}\n</tool_code>")
    answer = "Enough.</think>\n<answer>B</answer>"
    assert prior_dialect(answer) == answer  # no call: unchanged


def test_the_prior_corpus_parses_and_every_call_returns_frames(tiny_qwen3_dir, needle_samples):
    from transformers import AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.tools import CropConfig
    from paravt.rl.metrics import reversions
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.run.prior import prior_trajectories
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    # the RL agent of the paradox arms: <tool_code> refused, vanilla's think prefix off; the
    # corpus is traced with the prior's own dialect and the think prefix all the same
    rl = AgentConfig(max_rounds=2, system="compact", tool_dialect="tool_call", force_think=False)
    crop = CropConfig(sample_fps=1.0, max_frames=16)
    engine = ScriptedEngine(processor.tokenizer, lambda context: "unused")
    agent = AgentLoop(engine, ChatRenderer(processor), VideoReader(), rl, crop)
    cfg = PriorConfig(steps=1, tool_share=0.8, frame_budgets=(2, 4, 16))
    trajs = prior_trajectories(agent, needle_samples, cfg)
    assert [t.frame_budget for t in trajs] == [2, 4, 16, 2]  # cycled
    tools = [t for t in trajs if t.num_calls]
    assert len(tools) == 3  # 0.8 of 4 samples, rounded (teacher_plan)
    for traj in tools:
        first, answer = traj.turns
        assert "<tool_code>\ncrop_video(start_time=" in first.text
        assert traj.num_valid_calls == traj.num_calls == traj.num_tool_responses >= 1
        for result in first.results:  # 1 fps, at most 16 frames per crop
            start, end = result.window
            assert len(result.frames.indices) == min(16, max(2, int(end - start)))
        assert reversions(traj) == 1
        sample = next(s for s in needle_samples if s.id == traj.sample_id)
        assert answer.text.endswith(f"<answer>{sample.answer}</answer>")
    assert all(turn.text.startswith("<think>") for t in trajs for turn in t.turns)


def test_the_oracle_corpus_crops_around_the_needle(tiny_qwen3_dir, needle_samples):
    from transformers import AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.tools import CropConfig
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.run.prior import prior_trajectories
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    rl = AgentConfig(max_rounds=2, system="compact", tool_dialect="tool_call")
    engine = ScriptedEngine(processor.tokenizer, lambda context: "unused")
    crop = CropConfig(sample_fps=1.0, max_frames=16)
    agent = AgentLoop(engine, ChatRenderer(processor), VideoReader(), rl, crop)
    # tool_share 0.5 would leave half the corpus direct: the oracle pass crops every sample
    cfg = PriorConfig(steps=2, oracle_steps=1, tool_share=0.5, frame_budgets=(2,))
    trajs = prior_trajectories(agent, needle_samples, cfg, oracle=True)
    assert len(trajs) == len(needle_samples)
    for traj in trajs:
        sample = next(s for s in needle_samples if s.id == traj.sample_id)
        first, answer = traj.turns
        assert "<tool_code>\ncrop_video(start_time=" in first.text
        assert traj.num_valid_calls == traj.num_calls == len(sample.windows) >= 1
        for result, (lo, hi) in zip(first.results, sample.windows, strict=True):
            start, end = result.window  # the needle's window and 1 s either side
            assert start == pytest.approx(max(0.0, lo - 1.0), abs=0.05)
            assert end == pytest.approx(hi + 1.0, abs=0.05)
            # most of the crop's frames show the needle (a 3 s needle in a ~5 s crop at 1 fps)
            stamps = result.frames.timestamps
            inside = [t for t in stamps if lo <= t < hi]
            assert len(inside) >= 2 and len(inside) / len(stamps) >= 0.5
        assert answer.text.endswith(f"<answer>{sample.answer}</answer>")


def test_a_tool_free_curriculum_answers_from_overviews_that_show_the_needle(
    tiny_qwen3_dir, needle_samples
):
    from transformers import AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.run.prior import prior_trajectories
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    rl = AgentConfig(max_rounds=2, system="compact", tool_dialect="tool_call")
    engine = ScriptedEngine(processor.tokenizer, lambda context: "unused")
    agent = AgentLoop(engine, ChatRenderer(processor), VideoReader(), rl)

    def shown(traj) -> bool:  # a frame of the overview the trajectory was shown is a needle's
        sample = next(s for s in needle_samples if s.id == traj.sample_id)
        stamps = traj.visuals[0].frames.timestamps
        return any(lo <= t < hi for t in stamps for lo, hi in sample.windows)

    budgets = (2, 4, 8, 16)
    every = {  # the direct corpus at each budget alone: which overviews show the needle
        k: {t.sample_id: shown(t) for t in prior_trajectories(
            agent, needle_samples, PriorConfig(tool_share=0.0, frame_budgets=(k,))
        )}
        for k in budgets
    }  # fmt: skip
    cfg = PriorConfig(steps=2, oracle_steps=1, tool_share=0.0, frame_budgets=budgets)
    trajs = prior_trajectories(agent, needle_samples, cfg, oracle=True)
    expected = {  # per sample, the smallest budget whose overview shows the needle, if any
        s.id: next((k for k in budgets if every[k][s.id]), None) for s in needle_samples
    }
    assert {t.sample_id: t.frame_budget for t in trajs} == {i: k for i, k in expected.items() if k}
    assert len(trajs) > 0 and any(k != 16 for k in expected.values())  # the test tells apart
    for traj in trajs:
        sample = next(s for s in needle_samples if s.id == traj.sample_id)
        assert traj.num_calls == 0 and shown(traj)  # no tool: the answer from the overview
        assert traj.response_text.endswith(f"<answer>{sample.answer}</answer>")
    # no budget shows a needle: a clear error, not an empty curriculum
    blind = [s for s in needle_samples if not every[2][s.id]]
    assert blind
    with pytest.raises(ValueError, match=r"no overview at prior\.frame_budgets"):
        prior_trajectories(agent, blind, replace(cfg, frame_budgets=(2,)), oracle=True)


def test_greedy_reading_scores_answers_with_and_without_tools(tiny_qwen3_dir, needle_samples):
    from transformers import AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.run.prior import (
        PRIOR_DIALECT,
        greedy_reading,
        prior_teacher,
        reading_note,
        stage_agent,
    )
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    ids = [s.id for s in needle_samples]
    assert [s.answer for s in needle_samples][3] == "D" and ids[3] == "needle-train-00003"
    # sample 0 crops first (a <tool_code> block that runs), 1-3 answer from the overview, and
    # 3 wrongly (A for D): the only D among the answers B, [54.5, 57.5], B, D
    plan = {ids[0]: "search", **{i: "direct" for i in ids[1:]}}
    teacher = prior_teacher(needle_samples, plan)
    engine = ScriptedEngine(
        processor.tokenizer, lambda c: teacher(c).replace("<answer>D<", "<answer>A<")
    )
    rl = AgentConfig(max_rounds=2, system="compact", tool_dialect="tool_call")
    agent = stage_agent(
        AgentLoop(engine, ChatRenderer(processor), VideoReader(), rl), PRIOR_DIALECT
    )
    reading = greedy_reading(agent, needle_samples)
    # without tools: samples 1, 2 right, 3 wrong: 2 / 3; with a tool block: sample 0, right
    assert reading == {
        "budget": 16,
        "accuracy_without_tools": pytest.approx(2 / 3),
        "accuracy_with_tools": 1.0,
        "without_tools": 3,
        "with_tools": 1,
        "tool_share": 0.25,
    }
    assert reading_note("tool prior", reading) == (
        "tool prior: greedy held-out accuracy at K=16 without tools: 0.667 (3 of 4 rollouts; "
        "with a tool block: 1.000, 1)"
    )
    # a prior that always calls a tool has no accuracy without tools: a dash, not 0.000
    assert reading_note("x", {**reading, "without_tools": 0, "with_tools": 4}) == (
        "x: greedy held-out accuracy at K=16 without tools: - (0 of 4 rollouts; with a tool "
        "block: 1.000, 4)"
    )


def test_prior_config_checks_and_cache_key():
    with pytest.raises(ValueError, match="tool_share in"):
        PriorConfig(tool_share=1.5)
    with pytest.raises(ValueError, match="oracle_steps must be in"):
        PriorConfig(steps=3, oracle_steps=4)
    with pytest.raises(ValueError, match=r"frame_budgets must be >= 1"):
        PriorConfig(frame_budgets=(2, 0))
    with pytest.raises(ValueError, match=r"frame_budgets must be >= 1"):
        PriorConfig(frame_budgets=())
    # a tool-free prior's reading curriculum is overviews that show the needle: allowed
    assert PriorConfig(steps=3, oracle_steps=1, tool_share=0.0).oracle_steps == 1
    a = cache_key({"prior": {"steps": 3}, "model": {"path": "m"}})
    assert a == cache_key({"model": {"path": "m"}, "prior": {"steps": 3}})  # order-free
    assert a != cache_key({"prior": {"steps": 4}, "model": {"path": "m"}})
    assert len(a) == 16


class _Host:
    """What the stages need of the GRPO module: the policy, its processor, a reference reset."""

    def __init__(self, policy, processor):
        self.policy, self.processor, self.resets = policy, processor, 0
        self.policy_version = 0  # what the cold start syncs its engine with

    def reset_reference(self):
        self.resets += 1


def _agent(processor, policy):
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout.engines.hf import TransformersEngine
    from paravt.video.reader import VideoReader

    engine = TransformersEngine(policy, processor.tokenizer)
    cfg = AgentConfig(max_rounds=1, max_new_tokens=64, system="compact")
    return AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)


@pytest.fixture
def tiny(tiny_qwen3_dir):
    from paravt.models.loading import PolicySpec, load_policy

    torch.manual_seed(0)
    model, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir), freeze_vision=True))
    return model, processor


def test_prior_stage_teaches_the_dialect_greedily(tiny, needle_samples):
    from paravt.rollout.engine import SamplingParams
    from paravt.run.prior import dialect_rates, prior_stage

    model, processor = tiny
    agent = _agent(processor, model)
    greedy = SamplingParams(64, greedy=True)
    # the prior's tag AND the start of its call line (40 steps do not spell every call right)
    prior_call = "<tool_code>\ncrop_"

    def texts() -> list[str]:
        trajs = agent.run(needle_samples, [4] * len(needle_samples), 1, greedy)
        return [t.response_text for t in trajs]

    # (the tiny vocabulary makes <tool_code> one token, which a random model may emit alone)
    assert not any(prior_call in t for t in texts())
    cfg = PriorConfig(
        steps=40, tool_share=1.0, lr=5e-3, batch_size=4, frame_budgets=(4,), train_vision=False
    )
    losses = prior_stage(_Host(model, processor), agent, needle_samples, cfg)
    assert losses[-1] < 0.2 * losses[0]
    # every greedy rollout of the prior writes the prior's dialect, none the project's tag
    assert all(prior_call in t for t in texts())
    rates = dialect_rates(agent, needle_samples, 4, greedy)
    assert rates["tool_code"] == 1.0 and rates["tool_call"] == 0.0


def test_prior_and_cold_start_are_cached_by_config(tiny, needle_samples, tmp_path):
    from paravt.run.coldstart import ColdStartConfig
    from paravt.run.prior import prior_then_cold_start

    model, processor = tiny
    agent = _agent(processor, model)
    prior = PriorConfig(steps=1, batch_size=2, frame_budgets=(4,), cache_dir=str(tmp_path))
    cold = ColdStartConfig(steps=1, batch_size=2, frame_budgets=(4,), eval_limit=1)
    host = _Host(model, processor)
    parts = {"model": {"path": "tiny"}}
    first = prior_then_cold_start(
        host, agent, needle_samples, needle_samples[:1], prior, cold, parts
    )
    assert not first.cached
    # every run's notes carry the greedy K = 16 reading of the prior and of the cold start
    for stage in ("tool prior", "after the cold start"):
        line = f"{stage}: greedy held-out accuracy at K=16 without tools: "
        assert sum(n.startswith(line) for n in first.notes) == 1, first.notes
    (prior_entry,) = tmp_path.glob("prior-*")  # the prior alone, keyed without the cold start
    (entry,) = set(tmp_path.iterdir()) - {prior_entry}
    assert (entry / "state.pt").exists() and (prior_entry / "state.pt").exists()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    # a rerun loads: the weights come back even after they were scrambled, no training runs
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    again = prior_then_cold_start(
        host, agent, needle_samples, needle_samples[:1], prior, cold, parts
    )
    assert again.cached and again.losses == first.losses and host.resets == 2
    assert f"cache {entry.name} reused" in again.notes[-1]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in trained.items())
    # another cold start is another entry on the same cached prior
    longer = ColdStartConfig(steps=2, batch_size=2, frame_budgets=(4,), eval_limit=1)
    tuned = prior_then_cold_start(
        host, agent, needle_samples, needle_samples[:1], prior, longer,
        {**parts, "cold_start": {"steps": 2}},
    )  # fmt: skip
    assert not tuned.cached and len(tuned.losses) == 2
    assert f"tool prior: cache {prior_entry.name} reused" in tuned.notes
    assert len(list(tmp_path.iterdir())) == 3
    # another prior strength is another entry (no prior stage: no prior entry)
    other = PriorConfig(steps=0, batch_size=2, frame_budgets=(4,), cache_dir=str(tmp_path))
    prior_then_cold_start(host, agent, needle_samples, needle_samples[:1], other, cold, parts)
    assert len(list(tmp_path.iterdir())) == 4


def test_the_cold_start_replays_the_prior_corpus_when_asked(tiny, needle_samples, tmp_path):
    from paravt.run.coldstart import ColdStartConfig
    from paravt.run.prior import prior_then_cold_start

    model, processor = tiny
    agent = _agent(processor, model)
    prior = PriorConfig(steps=1, batch_size=2, frame_budgets=(4,), cache_dir=str(tmp_path))
    cold = ColdStartConfig(
        steps=1, batch_size=2, frame_budgets=(4,), eval_limit=1, prior_replay=0.5
    )
    result = prior_then_cold_start(
        _Host(model, processor), agent, needle_samples, needle_samples[:1], prior, cold, {}
    )
    n = len(needle_samples)
    assert f"cold start: 50% of its examples replayed from the prior's corpus ({n} " in "\n".join(
        result.notes
    )
    # without a prior stage there is nothing to replay: a clear error, not a silent no-op
    none = PriorConfig(steps=0, batch_size=2, frame_budgets=(4,), cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="replays a tool prior's corpus"):
        prior_then_cold_start(
            _Host(model, processor), agent, needle_samples, needle_samples[:1], none, cold, {}
        )


def _trained_turns(traj, tokenizer) -> list[str]:
    """The text of each run of trained tokens (one assistant turn each)."""
    runs, current = [], []
    for token, trained in zip(traj.token_ids, traj.loss_mask, strict=True):
        if trained:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    runs += [current] if current else []
    return [tokenizer.decode(run, skip_special_tokens=False) for run in runs]


def test_stages_without_the_forced_prefix_write_the_think_opening_themselves(
    tiny_qwen3_dir, needle_samples
):
    """prior.stage_think: without a forced prefix ("written", or "rl" under an RL agent that
    forces none) each turn's trained text of the prior's corpus and of the cold start's teacher
    opens `<think>` itself (what the prefix supplies under "forced"); the cache key follows the
    stages' effective choice."""
    from transformers import AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.tools import CropConfig
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.run.coldstart import ColdStartConfig, teacher_trajectories
    from paravt.run.prior import prior_trajectories, stage_agent, stages_key
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    tok = processor.tokenizer
    vanilla = AgentConfig(
        max_rounds=2, system="compact", tool_dialect="tool_call", force_think=False
    )
    engine = ScriptedEngine(tok, lambda context: "unused")
    agent = AgentLoop(engine, ChatRenderer(processor), VideoReader(), vanilla, CropConfig())
    for stage_think, opens in (("forced", False), ("written", True), ("rl", True)):
        prior = PriorConfig(steps=1, tool_share=0.5, frame_budgets=(4,), stage_think=stage_think)
        corpus = prior_trajectories(agent, needle_samples, prior)
        turns = [text for t in corpus for text in _trained_turns(t, tok)]
        assert len(turns) >= len(corpus) + 1  # a direct answer and a call then an answer
        assert all(text.startswith("<think>\n") == opens for text in turns), (stage_think, turns)
        switched = stage_agent(agent, "tool_call", prior.forces_think(vanilla.force_think))
        assert switched.cfg.force_think is not opens
        cold = ColdStartConfig(steps=1, frame_budgets=(4,), teacher_mix={4: {"search": 1}})
        taught = teacher_trajectories(switched, needle_samples, cold)
        assert all(t.num_valid_calls >= 1 for t in taught)  # the calls still parse and run
        turns = [text for t in taught for text in _trained_turns(t, tok)]
        assert all(text.startswith("<think>\n") == opens for text in turns), (stage_think, turns)

    def key(stage_think: str, force_think: bool) -> str:
        prior = PriorConfig(stage_think=stage_think)
        agent_cfg = {"force_think": force_think, "tool_dialect": "tool_call", "max_rounds": 2}
        return stages_key(prior, {"rollout.agent": agent_cfg})

    # forced and written: one entry for every arm, whatever RL forces; rl: the entry of the
    # choice it makes for that arm
    assert key("forced", True) == key("forced", False) == key("rl", True)
    assert key("written", True) == key("written", False) == key("rl", False)
    assert key("forced", True) != key("written", True)
    with pytest.raises(ValueError, match=r"prior\.stage_think must be one of"):
        PriorConfig(stage_think="matched")
