"""rollout.mode=stream on the real tiny Qwen3-VL: the generator keeps groups in flight, the
trainer takes whole groups, the staleness bound holds per group. Short Lightning fits on CPU;
after each the generator's pid is gone (no orphans)."""

from __future__ import annotations

import pytest
import torch

from paravt.generator.messages import StreamGroup, StreamResult
from paravt.generator.stream_rollouts import as_step
from paravt.types import Sample, Trajectory
from tests.generator.test_async_rollouts import Pids, fit, gone, scalars
from tests.modules.test_grpo_training import Batches, train

STREAM = ["rollout.mode=stream", "callbacks.benchmark_validation=null"]


class StreamPids(Pids):
    """`Pids`, which also records each step's (step, prompt ids, weight version)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        ids = tuple(s.id for s in batch.samples)
        self.seen.append((batch.step, ids, batch.weight_version, module.policy_version))


@pytest.mark.slow
def test_stream_with_staleness_0_makes_the_updates_of_sync(tmp_path, tiny_qwen3_dir, needle_dir):
    """One group a batch, no step ahead: each batch is the step's own prompt, sampled with the
    same seeds and weights as sync mode, token for token, so the same updates."""
    steps = ["trainer.max_steps=3", "callbacks.benchmark_validation=null"]
    torch.manual_seed(0)
    sync_seen, stream_seen = Batches(), Batches()
    _, sync = train(tmp_path / "sync", tiny_qwen3_dir, needle_dir, *steps, callbacks=[sync_seen])
    pids = Pids()
    torch.manual_seed(0)
    extra = [*steps, *STREAM, "rollout.max_staleness=0"]
    run = fit(tmp_path / "s", tiny_qwen3_dir, needle_dir, *extra, callbacks=[pids, stream_seen])
    assert len(pids.pids) == 1 and all(gone(p) for p in pids.pids)
    assert stream_seen.prompts == sync_seen.prompts
    assert stream_seen.versions == sync_seen.versions == [(0, 0), (1, 1), (2, 2)]
    for a, b in zip(stream_seen.batches, sync_seen.batches, strict=True):
        assert [t.token_ids for t in a.trajectories] == [t.token_ids for t in b.trajectories]
    assert run.module.reward_history == sync.module.reward_history
    for key in ("loss/loss", "grad_norm"):
        got, want = scalars(tmp_path / "s", key), scalars(tmp_path / "sync", key)
        assert got == pytest.approx(want, abs=1e-5), key


@pytest.mark.slow
def test_the_staleness_bound_holds_per_group_at_every_step(tmp_path, tiny_qwen3_dir, needle_dir):
    """max_staleness=1, 2 groups a batch, 3 trajectories in flight at most (one group of 2, as
    G=2 needs 2 slots), 3 rounds of 24 tokens: groups finish out of order and run across weight
    syncs. At every step no trained token is more than 1 update behind the weights it is trained
    from (the logged per-token maximum), and what got dropped was counted, never trained."""
    pids = StreamPids()
    fit(
        tmp_path,
        tiny_qwen3_dir,
        needle_dir,
        "trainer.max_steps=4",
        "data.batch_size=2",
        "rollout.max_staleness=1",
        "rollout.max_concurrent=3",
        "algorithm.loss=decoupled_ppo",
        "rollout.agent.max_rounds=3",
        "rollout.agent.max_new_tokens=24",
        *STREAM,
        callbacks=[pids],
    )
    assert len(pids.pids) == 1 and all(gone(p) for p in pids.pids)
    worst = scalars(tmp_path, "rollout/token_staleness_max")
    assert len(worst) == 4 and max(worst) <= 1.0
    assert [v - w <= 1 for _, _, w, v in pids.seen] == [True] * 4
    assert [len(ids) for _, ids, _, _ in pids.seen] == [2] * 4  # whole groups, a batch's worth
    assert max(scalars(tmp_path, "rollout/stream_in_flight")) <= 3
    dropped = scalars(tmp_path, "rollout/stale_dropped")
    assert dropped == sorted(dropped)  # a running total, in trajectories


def _traj(sample_id: str, g: int, versions=(), mask=()) -> Trajectory:
    n = len(mask)
    return Trajectory(sample_id, g, (1,) * n, tuple(mask), (0.0,) * n, (), 0, versions=versions)


def test_a_streamed_batch_reads_as_one_step_of_async_mode():
    # two groups of G=2 finished in the order b, a; b's video failed (no trained token); a's
    # trajectory 1 resumed after a sync: trained tokens of versions 6 and 5 -> the batch's 5
    a, b = (Sample(i, f"{i}.mp4", "q", "A") for i in "ab")
    b_trajs = (_traj("b", 0), _traj("b", 1))
    a_trajs = (_traj("a", 0, (6, 6), (0, 1)), _traj("a", 1, (6, 6, 5), (0, 1, 1)))
    groups = (
        StreamGroup(4, 1, b, 8, b_trajs, "undecodable"),
        StreamGroup(3, 0, a, 4, a_trajs),
    )
    task, result = as_step(StreamResult(5, groups, 0, 1.5, 2, 1), 2, (("c", "bad"),), 7)
    assert (task.step, task.samples, task.budgets, task.positions) == (5, (b, a), (8, 4), (1, 0))
    assert task.skipped == (("c", "bad"),)
    assert result.trajectories == b_trajs + a_trajs
    assert result.video_errors == {"b": "undecodable"}
    assert (result.version, result.busy_s) == (5, 1.5)
    # no trained token at all: the trainer's version
    _, alone = as_step(StreamResult(5, groups[:1], 0, 1.5, 2, 1), 2, (), 7)
    assert alone.version == 7


@pytest.mark.slow
def test_kill_9_leaves_no_generator_and_resume_continues(tmp_path, tiny_run_overrides):
    """`python train.py rollout.mode=stream` killed with SIGKILL once a checkpoint holds step 1
    (groups in flight and buffered): its generator exits by itself; `ckpt_path=last` streams
    again from the checkpoint's step with a fresh generator, its first batch sampled under the
    checkpoint's weights (nothing from the killed one), and loses no update."""
    from tests.generator.test_async_rollouts import _first_resumed_batch, _killed_at_a_checkpoint
    from tests.generator.test_async_rollouts import _train_py as train_py
    from tests.modules.test_kill_resume_cli import _checkpoint_step

    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    overrides = [*tiny_run_overrides, "rollout.mode=stream", "rollout.max_staleness=2"]
    overrides += ["algorithm.loss=decoupled_ppo"]
    killed = train_py(run_dir, overrides, "trainer.max_steps=200")
    step = _killed_at_a_checkpoint(last, killed, 1)
    resumed = train_py(run_dir, overrides, f"trainer.max_steps={step + 1}", "ckpt_path=last")
    out = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, out[-3000:]
    assert f"resumed from {last} at step {step}" in out, out
    assert _checkpoint_step(last) == step + 1  # its one step trained and saved
    assert _first_resumed_batch(run_dir) == (step, 0.0)
