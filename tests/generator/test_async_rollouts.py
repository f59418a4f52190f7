"""rollout.mode=async on the real tiny Qwen3-VL: a generator process, its staleness bound and
its failure behaviour. Each run is a short Lightning fit on CPU; after every test the
generator's pid is gone (no orphans)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from paravt.generator.async_rollouts import keep_share
from paravt.generator.worker import GeneratorError, GenResult, GenTask
from paravt.types import Sample
from tests import forkserver
from tests.modules.test_grpo_training import Batches, train

ASYNC = ["rollout.mode=async", "callbacks.benchmark_validation=null"]


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` has exited (and been reaped) within `within_s`."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True  # a zombie: exited, its parent has not reaped it yet
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False


class Pids(pl.Callback):
    """Remembers the generator's pid (and can slow the trainer down: `sleep_s` after each of
    the first `slow_steps` steps, every step when None)."""

    def __init__(self, sleep_s: float = 0.0, slow_steps: int | None = None):
        self.pids: set[int] = set()
        self.sleep_s, self.slow_steps = sleep_s, slow_steps

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        rollouts = trainer.datamodule.async_rollouts
        if rollouts is not None:
            self.pids.add(rollouts.generator.pid)
        if self.slow_steps is None or batch.step < self.slow_steps:
            time.sleep(self.sleep_s)


def scalars(tmp_path, key: str) -> list[float]:
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    return [e.value for e in acc.Scalars(key)]


def fit(tmp_path, tiny_dir, needle_dir, *extra, callbacks=()):
    from paravt.run.build import build_run
    from tests.modules.test_grpo_training import CPU_SCALE, compose_cfg, local_paths

    cfg = compose_cfg(CPU_SCALE + local_paths(tmp_path, tiny_dir, needle_dir) + list(extra))
    run = build_run(cfg)
    run.trainer.callbacks.extend(callbacks)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    return run


@pytest.mark.slow
def test_async_with_staleness_0_makes_the_updates_of_sync(tmp_path, tiny_qwen3_dir, needle_dir):
    steps = ["trainer.max_steps=3", "callbacks.benchmark_validation=null"]
    torch.manual_seed(0)
    sync_seen, async_seen = Batches(), Batches()
    _, sync = train(tmp_path / "sync", tiny_qwen3_dir, needle_dir, *steps, callbacks=[sync_seen])
    pids = Pids()
    torch.manual_seed(0)
    extra = [*steps, *ASYNC]
    run = fit(tmp_path / "async", tiny_qwen3_dir, needle_dir, *extra, callbacks=[pids, async_seen])
    assert len(pids.pids) == 1 and all(gone(p) for p in pids.pids)
    # The same rollouts (token for token), versions and rewards at every step ...
    assert async_seen.versions == sync_seen.versions == [(0, 0), (1, 1), (2, 2)]
    for a, b in zip(async_seen.batches, sync_seen.batches, strict=True):
        assert [t.token_ids for t in a.trajectories] == [t.token_ids for t in b.trajectories]
    assert run.module.reward_history == sync.module.reward_history
    for key in ("loss/loss", "loss/logprob_gap", "grad_norm"):
        got, want = scalars(tmp_path / "async", key), scalars(tmp_path / "sync", key)
        assert got == pytest.approx(want, abs=1e-5), key
    # ... so the same weights after three updates.
    for (name, a), b in zip(
        run.module.policy.named_parameters(), sync.module.policy.parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
    assert scalars(tmp_path / "async", "rollout/staleness") == [0.0, 0.0, 0.0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("steps", "partial"), [(6, False), (4, True)], ids=["slow_trainer_then_generator", "partial"]
)
def test_the_staleness_bound_is_never_exceeded(
    tmp_path, tiny_qwen3_dir, needle_dir, steps, partial
):
    """max_staleness=1: generation runs one step ahead. A slow trainer finds every batch ready
    (sampled one update back); a slow generator (long generations) makes the trainer wait; with
    partial rollouts the steps in flight share the generator's rounds. In all three, no token
    is trained more than 1 update behind, and nothing was dropped. The first two are one run:
    its trainer sleeps 3 s after each of its first 3 steps, then runs at its own pace against
    the generator's 48-token generations."""
    pids, seen = Pids(sleep_s=0.0 if partial else 3.0, slow_steps=3), Batches()
    fit(
        tmp_path,
        tiny_qwen3_dir,
        needle_dir,
        f"trainer.max_steps={steps}",
        "rollout.max_staleness=1",
        "algorithm.loss=decoupled_ppo",
        "rollout.agent.max_new_tokens=48",
        f"rollout.partial={partial}",
        *ASYNC,
        callbacks=[pids, seen],
    )
    assert all(gone(p) for p in pids.pids)
    assert max(scalars(tmp_path, "rollout/token_staleness_max")) <= 1.0  # token by token
    staleness = scalars(tmp_path, "rollout/staleness")
    trained = scalars(tmp_path, "update/trajectories")
    assert len(staleness) == steps and sum(trained) > 0
    # Per trajectory: every one of a step's trajectories carries that step's version.
    per_trajectory = [s for s, n in zip(staleness, trained, strict=True) for _ in range(int(n))]
    assert max(per_trajectory) <= 1
    assert staleness[0] == 0.0 and staleness[1:] == [1.0] * (steps - 1)  # generated a step ahead
    assert scalars(tmp_path, "rollout/stale_dropped") == [0.0] * steps
    assert seen.versions == [(0, 0)] + [(t, t - 1) for t in range(1, steps)]


class Handle(pl.Callback):
    """Keeps the trainer's handle on its generator process (the DataModule drops it)."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.generator = trainer.datamodule.async_rollouts.generator


@pytest.mark.slow
def test_an_agent_program_plays_the_async_generators_rollouts(tmp_path, tiny_qwen3_dir, needle_dir):
    """rollout.agent_program under rollout.mode=async: the generator process plays the program
    through its own gateway, one step ahead, and the bound holds as with paravt's loop."""
    pids, seen, handle = Pids(), Batches(), Handle()
    steps = 3
    fit(
        tmp_path,
        tiny_qwen3_dir,
        needle_dir,
        f"trainer.max_steps={steps}",
        "rollout.max_staleness=1",
        "algorithm.loss=decoupled_ppo",
        "rollout.agent_program=tests.gateway.mimic:http_program",
        "rollout.agent_workers=2",
        *ASYNC,
        callbacks=[pids, seen, handle],
    )
    assert len(pids.pids) == 1 and all(gone(p) for p in pids.pids)
    # It stopped by itself (its gateway and agent workers closed), not by terminate (-15).
    assert handle.generator.process.exitcode == 0
    # The program's rollouts: http_program returns 1.0 as its reward (paravt's loop sets none);
    # 3 steps x 1 prompt x 2 rollouts = 6 episodes.
    rewards = [t.agent_reward for b in seen.batches for t in b.trajectories]
    assert rewards == [1.0] * 6
    assert all(len(t.token_ids) > 0 for b in seen.batches for t in b.trajectories)
    # Generated one step ahead, nothing dropped, no token more than 1 update behind.
    assert seen.versions == [(0, 0), (1, 0), (2, 1)]
    assert scalars(tmp_path, "rollout/staleness") == [0.0, 1.0, 1.0]
    assert max(scalars(tmp_path, "rollout/token_staleness_max")) <= 1.0
    assert scalars(tmp_path, "rollout/stale_dropped") == [0.0] * steps


class KillGenerator(Pids):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
        os.kill(trainer.datamodule.async_rollouts.generator.pid, signal.SIGKILL)


class TrainerCrash(Pids):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
        raise RuntimeError("trainer crashed on purpose")


@pytest.mark.slow
def test_a_dead_generator_stops_training_with_its_error(tmp_path, tiny_qwen3_dir, needle_dir):
    pids = KillGenerator()
    with pytest.raises(GeneratorError, match=r"died with exit code -9 before sending step 1"):
        fit(tmp_path, tiny_qwen3_dir, needle_dir, "trainer.max_steps=3", *ASYNC, callbacks=[pids])
    assert len(pids.pids) == 1 and all(gone(p) for p in pids.pids)


@pytest.mark.slow
def test_an_exception_in_the_generator_stops_training(tmp_path, tiny_qwen3_dir, needle_dir):
    """A video that stops decoding after setup, with data.fail_fast=true: the child's error
    (its traceback, the video named) is the trainer's."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(needle_dir, data)

    class BreakVideos(Pids):
        def on_train_start(self, trainer, module):
            for v in data.glob("**/*.mp4"):
                v.write_bytes(b"not a video")

    pids, before = BreakVideos(), children()
    with pytest.raises(GeneratorError, match=r"(?s)rollout generator failed.*\.mp4"):
        fit(
            tmp_path,
            tiny_qwen3_dir,
            data,
            "trainer.max_steps=2",
            "data.fail_fast=true",
            *ASYNC,
            callbacks=[pids],
        )
    assert all(gone(p) for p in children() - before)


@pytest.mark.slow
def test_a_generator_slower_than_its_timeout_stops_training(tmp_path, tiny_qwen3_dir, needle_dir):
    """`rollout.generator_timeout_s` reaches the trainer's wait: a step's rollouts take longer
    than 0.2 s here, so the run stops at step 0 with the timeout's message, generator closed."""
    pids, before = Pids(), children()
    with pytest.raises(GeneratorError, match=r"sent no rollouts for step 0 in 0\.2 s"):
        fit(
            tmp_path,
            tiny_qwen3_dir,
            needle_dir,
            "trainer.max_steps=2",
            "rollout.generator_timeout_s=0.2",
            "rollout.agent.max_new_tokens=64",
            *ASYNC,
            callbacks=[pids],
        )
    assert not pids.pids  # no step ended
    assert all(gone(p) for p in children() - before)


@pytest.mark.slow
def test_a_trainer_crash_leaves_no_generator(tmp_path, tiny_qwen3_dir, needle_dir):
    pids = TrainerCrash()
    with pytest.raises(RuntimeError, match="trainer crashed on purpose"):
        fit(tmp_path, tiny_qwen3_dir, needle_dir, "trainer.max_steps=3", *ASYNC, callbacks=[pids])
    assert len(pids.pids) == 1 and all(gone(p) for p in pids.pids)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().split(")")[-1].split()[1])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None


def children() -> set[int]:
    """This process's live children, but multiprocessing's resource tracker (it serves every
    spawn context of the process until the process exits)."""
    return {p for p in _children_of(os.getpid()) if not _is_tracker(p)}


def _train_py(run_dir: Path, overrides: list[str], *extra: str) -> forkserver.Child:
    """`python train.py` in a process of its own, forked from an interpreter holding torch,
    Lightning and transformers (tests/forkserver.py); its output in `run_dir`'s parent."""
    from tests.modules.test_kill_resume_cli import ROOT, _command

    args = _command(run_dir, overrides, *extra)[1:]  # [1:]: train.py
    out = run_dir.parent / f"train-{time.monotonic_ns()}.log"
    env = {"OMP_NUM_THREADS": "1"}
    return forkserver.start_script(ROOT / "train.py", args, out, env, run_dir.parent)


def _killed_at_a_checkpoint(last: Path, proc: forkserver.Child, step: int) -> int:
    """SIGKILL `proc` once `last` holds step `step` (the generator a step ahead); asserts its
    generator exits by itself; the step of the last complete checkpoint."""
    from tests.modules.test_kill_resume_cli import _checkpoint_step, _wait_for_step

    _wait_for_step(last, proc, step)
    generators = [p for p in _children_of(proc.pid) if not _is_tracker(p)]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(generators) == 1 and gone(generators[0], within_s=15)
    return _checkpoint_step(last)


def _first_resumed_batch(run_dir: Path) -> tuple[float, float]:
    """(weight_version, rollout/token_staleness_max) of the newest run's first logged step."""
    events = max(run_dir.rglob("events.out.tfevents*"), key=lambda p: p.stat().st_mtime)
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    first = (acc.Scalars(k)[0].value for k in ("weight_version", "rollout/token_staleness_max"))
    return tuple(first)


@pytest.mark.slow
def test_kill_9_leaves_no_generator_and_resume_continues(tmp_path, tiny_run_overrides):
    """`python train.py rollout.mode=async` killed with SIGKILL: its generator exits by itself;
    `ckpt_path=last` goes on from the checkpointed weights with fresh rollouts and the step
    count loses no update. One chain of three launches covers both rollout modes: a run with
    partial rollouts is killed while steps are in flight in the generator (paused between
    rounds or mid-round): they are lost with it, and the resumed run (whole rollouts) samples
    every step after the checkpoint from its prompts, under the checkpoint's weights; that run
    is killed in turn (whole rollouts, the generator a step ahead) and resumed with partial
    rollouts, which regenerate from the checkpoint, whole, too."""
    from tests.modules.test_kill_resume_cli import _checkpoint_step

    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    overrides = [*tiny_run_overrides, "rollout.mode=async", "rollout.max_staleness=1"]
    overrides += ["algorithm.loss=decoupled_ppo"]
    partial = _train_py(run_dir, [*overrides, "rollout.partial=true"], "trainer.max_steps=200")
    step = _killed_at_a_checkpoint(last, partial, 1)
    whole = _train_py(
        run_dir, [*overrides, "rollout.partial=false"], "trainer.max_steps=200", "ckpt_path=last"
    )
    resumed_at = _killed_at_a_checkpoint(last, whole, step + 1)
    out = whole.communicate()[0]
    assert f"Restored all states from the checkpoint at {last}" in out, out[-3000:]
    # The resumed run's first batch comes from its fresh generator, sampled whole under the
    # checkpoint's weights (version `step`), none of it from the killed generator's steps.
    assert _first_resumed_batch(run_dir) == (step, 0.0)
    final = _train_py(
        run_dir,
        [*overrides, "rollout.partial=true"],
        f"trainer.max_steps={resumed_at + 1}",
        "ckpt_path=last",
    )
    out = final.communicate(timeout=600)[0]
    assert final.returncode == 0, out[-3000:]
    assert f"resumed from {last} at step {resumed_at}" in out, out
    assert _checkpoint_step(last) == resumed_at + 1  # its one step trained and saved
    assert _first_resumed_batch(run_dir) == (resumed_at, 0.0)


def _children_of(pid: int) -> list[int]:
    return [int(p) for p in filter(str.isdigit, os.listdir("/proc")) if _ppid(int(p)) == pid]


def _is_tracker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"resource_tracker" in f.read()
    except FileNotFoundError:
        return True


def test_each_rank_is_sent_only_its_share_of_the_trajectories():
    # 4 prompts x G=2 (trajectories 0..7 stand for the real ones); prompt "b"'s video failed,
    # so the kept groups a, c, d are dealt a, c to rank 0 and d to rank 1 (shard_bounds)
    samples = tuple(Sample(i, f"{i}.mp4", "q", "A") for i in "abcd")
    task = GenTask(3, samples, (8, 8, 8, 8), 2, None)
    result = GenResult(3, 1, tuple(range(8)), {"b": "undecodable"}, 0.5, {})
    rank0, rank1 = (keep_share(task, result, r, 2) for r in (0, 1))
    assert rank0.trajectories == (0, 1, None, None, 4, 5, None, None)
    assert rank1.trajectories == (None, None, None, None, None, None, 6, 7)
    assert rank1.video_errors == {"b": "undecodable"} and rank1.version == 1
    assert keep_share(task, result, 0, 1).trajectories == (0, 1, None, None, 4, 5, 6, 7)
