"""Training's rollouts by an agent program through the gateway: the same trajectories as
`AgentLoop` for the same policy, a failing agent isolated, programs named in config form."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.prompts import FORCED_THINK
from paravt.agent.render import ChatRenderer
from paravt.gateway.app import Gateway
from paravt.gateway.batcher import Batcher
from paravt.gateway.episode import EpisodeRenderer
from paravt.gateway.media import MediaConfig
from paravt.gateway.rollouts import AGENT_ERROR, GatewayRollouts, load_program
from paravt.rewards.compose import RewardWeights, trajectory_reward
from paravt.rl.objective import rollout_metrics
from paravt.rollout.engine import SamplingParams, derive_seed
from paravt.video.reader import VideoReader
from tests.gateway.mimic import (
    editing_program,
    failing_program,
    hanging_program,
    http_program,
    posting_program,
    silent_program,
)
from tests.gateway.test_episode import scripted

GREEDY = SamplingParams(greedy=True, max_new_tokens=200)


@pytest.fixture(scope="module")
def setup(tiny_qwen3_dir, needle_dir):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    renderer = ChatRenderer(processor)
    media = MediaConfig(root=str(needle_dir), factor=renderer.frame_factor)
    episodes = EpisodeRenderer(renderer, VideoReader(), media, prefix=FORCED_THINK)
    engine = scripted(processor.tokenizer)
    return Gateway(episodes, Batcher(engine)), engine, renderer


def test_agent_program_rollouts_equal_the_agent_loops(setup, needle_samples):
    gateway, engine, renderer = setup
    samples = needle_samples[:2]
    loop = AgentLoop(engine, renderer, VideoReader(), AgentConfig(max_rounds=2))
    theirs = loop.run(samples, [4, 4], 2, GREEDY)
    with GatewayRollouts(gateway, http_program, VideoReader(), workers=4) as rollouts:
        ours = rollouts.run(samples, [4, 4], 2, GREEDY)  # the agent's temperature is overridden
    assert len(ours) == 4 and not ours.video_errors and rollouts.forks == 0
    for a, b in zip(ours, theirs, strict=True):
        assert (a.sample_id, a.group_index) == (b.sample_id, b.group_index)
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert a.logprobs == b.logprobs and len(a.visuals) == len(b.visuals) == 3
    assert rollouts.rewards == {(s.id, g): 1.0 for s in samples for g in range(2)}


def test_a_failing_agent_program_fails_only_its_rollouts(setup, needle_samples):
    gateway = setup[0]
    samples = needle_samples[:2]  # ids ...00000 and ...00001
    with GatewayRollouts(gateway, failing_program, VideoReader(), workers=4) as rollouts:
        run = rollouts.run(samples, [4, 4], 2, GREEDY)
    assert [t.finish_reason for t in run] == ["stop", "stop", AGENT_ERROR, AGENT_ERROR]
    assert "KeyError" in run.video_errors[samples[1].id]
    assert not gateway.episodes  # every episode closed


def test_a_hung_agent_program_is_closed_after_the_idle_limit(setup, needle_samples):
    """Sample 1's program sleeps 2.5 s after its first turn, past a 1 s idle limit: its
    episodes are closed and its rollouts fail; sample 0's, which returned at once, are held
    (not idle) until collected, however long sample 1's took, and so are episodes waiting for
    a worker (two workers here: sample 0's episodes wait 2.5 s for them)."""
    gateway, samples = setup[0], needle_samples[:2]
    idle = Gateway(gateway.renderer, gateway.batcher, episode_idle_s=1.0)
    with GatewayRollouts(idle, hanging_program, VideoReader(), workers=2) as rollouts:
        run = rollouts.run(samples[::-1], [4, 4], 2, GREEDY)  # the hung one collected first
    assert [t.finish_reason for t in run] == [AGENT_ERROR, AGENT_ERROR, "stop", "stop"]
    assert "idle for 1 s" in run.video_errors[samples[1].id]
    assert not idle.episodes and idle.expired == 2
    assert rollouts.rewards == {(samples[0].id, g): 1.0 for g in range(2)}


def test_a_posted_reward_rides_on_the_rollout_and_is_trained_on_if_asked(setup, needle_samples):
    """The program posts 0.25 (`{base_url}/reward`) and returns 1: the posted one wins, on the
    trajectory; reward.agent_reward=agent trains on it; a program that posts nothing is refused
    under "agent" with the rollout named."""
    gateway, sample = setup[0], needle_samples[0]
    agent = RewardWeights(agent_reward="agent")
    with GatewayRollouts(gateway, posting_program, VideoReader(), workers=2) as rollouts:
        run = rollouts.run([sample], [4], 2, GREEDY)
    assert [t.agent_reward for t in run] == [0.25, 0.25]
    assert [trajectory_reward(t, sample, agent).total for t in run] == [0.25, 0.25]
    # The default (reward.agent_reward=paravt) trains on paravt's R, whatever was posted.
    assert (
        trajectory_reward(run[0], sample).total
        == trajectory_reward(replace(run[0], agent_reward=None), sample).total
    )
    with GatewayRollouts(gateway, silent_program, VideoReader(), workers=2) as rollouts:
        (silent,) = rollouts.run([sample], [4], 1, GREEDY)
    assert silent.agent_reward is None
    with pytest.raises(ValueError, match=f"rollout {sample.id}#0 posted no reward"):
        trajectory_reward(silent, sample, agent)


def test_an_agent_that_edits_its_history_forks_and_the_step_logs_it(setup, needle_samples):
    """An agent that rewrites the model's reply before its next request forks each episode
    once; the rollout carries the count and the step's metrics log it as gateway/forks
    (2 episodes x 1), and a rollout of paravt's own loop (forks None) logs no such key."""
    gateway, sample = setup[0], needle_samples[0]
    with GatewayRollouts(gateway, editing_program, VideoReader(), workers=2) as rollouts:
        run = rollouts.run([sample], [4], 2, GREEDY)
    assert [t.forks for t in run] == [1, 1] and rollouts.forks == 2
    rewards = [trajectory_reward(t, sample) for t in run]
    assert rollout_metrics(list(run), rewards)["gateway/forks"] == 2.0
    plain = [replace(t, forks=None) for t in run]
    assert "gateway/forks" not in rollout_metrics(plain, rewards)


def test_agent_programs_are_named_module_colon_function():
    assert load_program("tests.gateway.mimic:http_program") is http_program
    with pytest.raises(ValueError, match=r"package\.module:function"):
        load_program("tests.gateway.mimic")
    with pytest.raises(ValueError, match="no function nope"):
        load_program("tests.gateway.mimic:nope")


@pytest.mark.slow
def test_training_plays_its_rollouts_with_the_agent_program(train_py, tmp_path, tiny_run_overrides):
    log = tmp_path / "agent.log"
    out = train_py(
        "experiment=demo",
        "trainer.max_steps=1",
        "cold_start=null",
        *tiny_run_overrides,
        "rollout.agent.max_new_tokens=8",
        "rollout.agent_program=tests.gateway.mimic:logging_program",
        "rollout.agent_workers=2",
        "callbacks.benchmark_validation.limit=1",
        "trainer.enable_progress_bar=false",
        cwd=tmp_path,
        env={"PARAVT_TEST_AGENT_LOG": str(log)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    episodes = log.read_text().splitlines()
    # 1 step x 1 prompt x 2 rollouts by the program; the held-out validation (before and
    # after training, 1 sample) is played by the program too.
    assert sum(e.startswith("needle-train") for e in episodes) == 2
    assert sum(e.startswith("needle-eval") for e in episodes) == 2


def test_an_agent_program_refuses_partial_and_stream_rollouts():
    from paravt.modules.rollout_config import RolloutConfig

    program = "tests.gateway.mimic:http_program"
    RolloutConfig(agent_program=program, mode="async")  # async plays it in the generator
    with pytest.raises(ValueError, match=r"agent program .* set rollout\.partial=false"):
        RolloutConfig(agent_program=program, mode="async", partial=True)
    with pytest.raises(ValueError, match=r"agent program .* set rollout\.mode=async or sync"):
        RolloutConfig(agent_program=program, mode="stream")
    with pytest.raises(ValueError, match=r"rollout\.agent_workers >= 1, got 0"):
        RolloutConfig(agent_program=program, agent_workers=0)
    with pytest.raises(ValueError, match=r"rollout\.agent_idle_s must be > 0"):
        RolloutConfig(agent_idle_s=0)


def test_the_example_agent_shows_its_own_tools_frames_with_their_clock(
    setup, needle_samples, tiny_qwen3_dir
):
    """...and its rollouts pass paravt's rollout/trainer consistency check: each clip belongs to
    the turn whose calls its tool message answered (a check that finds a clip no turn accounts
    for drops the rollout from the loss)."""
    from transformers import AutoModelForImageTextToText

    from paravt.data.packing import model_rope_index
    from paravt.gateway import example_agent
    from paravt.rollout.consistency import VisionSpec, check_trajectory

    gateway, processor = setup[0], AutoProcessor.from_pretrained(tiny_qwen3_dir)
    rope = model_rope_index(AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir))
    spec, decode = VisionSpec.from_processor(processor), processor.tokenizer.decode
    with GatewayRollouts(gateway, example_agent.run, VideoReader(), workers=2) as rollouts:
        run = rollouts.run(needle_samples[:1], [4], 2, GREEDY)
    for traj in run:
        # The scripted policy crops [2, 6] s and [10, 14] s, then answers: the agent's decord
        # tool returns 1 fps frames, 4 a window, shown as two clips after the overview.
        assert len(traj.visuals) == 3 and traj.num_tool_responses == 2
        assert traj.visuals[1].frames.timestamps == (2.0, 3.0, 4.0, 5.0)
        assert traj.visuals[2].frames.timestamps == (10.0, 11.0, 12.0, 13.0)
        assert traj.turns[-1].text.endswith("<answer>A</answer>")
        assert [len(t.results) for t in traj.turns] == [2, 0]
        assert check_trajectory(traj, spec, rope, decode) == []


class _SeedLog:
    """The scripted engine, noting the seed of every request it is asked to continue."""

    def __init__(self, engine):
        self.engine, self.seeds = engine, []

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def generate(self, requests, params):
        self.seeds += [r.seed for r in requests]
        return self.engine.generate(requests, params)


def test_agent_program_requests_take_the_agent_loops_seeds(setup, needle_samples):
    """Rollout g of the sample at batch position p samples turn t with the seed the agent loop
    gives it, derive_seed(derive_seed(derive_seed(step seed, p), g), t, 0): one seed per request
    across the step's ranks and turns, whichever episodes share an engine call."""
    gateway, engine, renderer = setup
    samples, positions = needle_samples[:2], (5, 9)  # this rank's share of a larger batch
    params = SamplingParams(greedy=True, max_new_tokens=200, seed=7)
    loop_log, ours_log = _SeedLog(engine), _SeedLog(engine)
    loop = AgentLoop(loop_log, renderer, VideoReader(), AgentConfig(max_rounds=2))
    loop.run(samples, [4, 4], 2, params, positions=positions)
    seeded = Gateway(gateway.renderer, Batcher(ours_log))
    with GatewayRollouts(seeded, http_program, VideoReader(), workers=4) as rollouts:
        rollouts.run(samples, [4, 4], 2, params, positions=positions)
    assert None not in ours_log.seeds and len(set(ours_log.seeds)) == len(ours_log.seeds)
    assert sorted(ours_log.seeds) == sorted(loop_log.seeds)
    first = derive_seed(derive_seed(derive_seed(7, 9), 1), 0, 0)  # position 9, g = 1, turn 0
    assert first in ours_log.seeds
    with pytest.raises(ValueError, match="2 positions for 1 samples"):
        rollouts.run(samples[:1], [4], 2, params, positions=positions)


def test_the_example_agent_ends_its_episode_at_a_turn_cut_by_the_token_cap(setup, needle_samples):
    """A turn cut by the cap just after its first whole call finishes as "length" (not
    "tool_calls"): the agent stops there, as paravt's loop does, instead of going on from a
    turn without its end (a fork, "unfinished")."""
    from paravt.agent.scripts import call_text
    from paravt.gateway import example_agent

    gateway = setup[0]
    tok = gateway.renderer.renderer.tokenizer
    first = "look</think>\n" + call_text(2.0, 6.0)  # the scripted turn's text up to its 1st call
    cap = len(tok(first, add_special_tokens=False)["input_ids"]) + 1
    rollouts = GatewayRollouts(gateway, example_agent.run, VideoReader(), max_new_tokens=cap)
    with rollouts:
        (traj,) = rollouts.run(needle_samples[:1], [4], 1, GREEDY)
    assert traj.num_valid_calls == 1  # the cut turn holds a whole call
    assert rollouts.forks == 0 and traj.finish_reason == "length" and len(traj.turns) == 1
    assert sum(traj.loss_mask) == cap
