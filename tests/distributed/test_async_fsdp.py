"""`train.py trainer=fsdp_cpu rollout.mode=async`: an FSDP2 trainer on 2 CPU ranks (gloo) with
rank 0's generator process.

After each update every rank joins the gather of the full weights from the shards and rank 0
publishes them to the generator's shared copy; rank 0 takes each step's whole batch of rollouts
and broadcasts it, each rank training its share (3 prompts a step: 2 + 1). With
`max_staleness=0` nothing overlaps, so the run must equal one process in `rollout.mode=sync`
step for step: the same rewards, losses and gradient norms, and the same weights at the end.
KL is a loss term there, not in the reward (`WELL_CONDITIONED`). Collectives are checked under
the simulated NCCL rule.

The others, under FSDP2 too: rank 0 killed by SIGKILL and the run resumed, the resumed run
also showing the bound (max_staleness=1) and then a generator killed mid-run; an exception on
rank 1 (on rank 0: see that test's docstring).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests import forkserver
from tests.distributed.test_train_fsdp import _max_diff, _weights
from tests.distributed.test_train_fsdp_vllm import _scalars
from tests.generator.test_async_rollouts import gone

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
SETTINGS = {
    "cold_start": "null",
    "model.freeze_vision": "true",
    "data.batch_size": "3",
    "rollout.group_size": "4",
    "rollout.temperature": "1.2",
    "rollout.agent.max_new_tokens": "32",
    "algorithm.kl_coef": "0.1",
    "trainer.max_steps": "3",
    "callbacks.benchmark_validation": "null",
}
# The KL as a loss term, not in the reward: with it in the reward a group whose G rewards are
# equal (all 12 of step 0 under the request seeds) has totals that differ only by the ~1e-7
# round-off of the log-probs, which group and batch normalisation scale up to unit advantages,
# so 1 and 2 ranks (whose forwards round differently) would train on different noise.
WELL_CONDITIONED = ("algorithm.kl_in_reward=false", "algorithm.kl_estimator=k3")


def _args(overrides: list[str], run_dir: Path, *extra: str) -> list[str]:
    """`train.py`'s arguments: the tiny run's overrides, SETTINGS and `extra`, each key given
    once (the later wins)."""
    given = {o.split("=", 1)[0] for o in extra}
    settings = [f"{k}={v}" for k, v in SETTINGS.items() if k not in given]
    mine = given | set(SETTINGS)
    base = [o for o in overrides if o.split("=", 1)[0] not in mine]
    return [*base, *settings, f"hydra.run.dir={run_dir}", *extra]


def _run(overrides: list[str], run_dir: Path, *extra: str):
    """`train.py` to its end; rank 0 (the only rank of a 1-process run) forked from an
    interpreter holding the heavy imports (tests/forkserver.py), rank 1 Lightning's subprocess."""
    argv = [str(ROOT / "train.py"), *_args(overrides, run_dir, *extra)]
    logs = run_dir.parent / f"{run_dir.name}_logs"
    return forkserver.run(argv, logs, ROOT, {"PARAVT_COLLECTIVE_RULE": "nccl"}, timeout=900)


ASYNC_BOUND_1 = [
    "trainer=fsdp_cpu",
    "rollout.mode=async",
    "rollout.max_staleness=1",
    "algorithm.loss=decoupled_ppo",
    "rollout.agent.max_new_tokens=8",  # the faults' runs: what ends them, not what they learn
]


def _probed_run(overrides: list[str], tmp_path: Path, **probe) -> tuple[str, list]:
    """A 5-step async run at max_staleness 1 that must fail, with `AsyncProbe(**probe)`
    (tests/distributed/async_faults.py) recording every rank's steps; (its output, the
    records)."""
    records = tmp_path / "probe.jsonl"
    target = "+callbacks.async_probe._target_=tests.distributed.async_faults.AsyncProbe"
    proc = _run(
        overrides,
        tmp_path / "run",
        *ASYNC_BOUND_1,
        "trainer.max_steps=5",
        target,
        f"+callbacks.async_probe.path={records}",
        *(f"+callbacks.async_probe.{k}={v}" for k, v in probe.items()),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    return out, [json.loads(line) for line in records.read_text().splitlines()]


def _train(overrides: list[str], run_dir: Path, *extra: str) -> str:
    proc = _run(overrides, run_dir, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_two_ranks_async_at_staleness_0_equal_one_rank_sync(tiny_run_overrides, tmp_path):
    _train(tiny_run_overrides, tmp_path / "sync", "trainer=cpu", *WELL_CONDITIONED)
    out = _train(
        tiny_run_overrides,
        tmp_path / "async",
        "trainer=fsdp_cpu",
        "rollout.mode=async",
        "rollout.max_staleness=0",
        *WELL_CONDITIONED,
    )
    assert "MEMBER: 2/2" in out and out.count("== paravt run") == 1
    sync, two = _scalars(tmp_path / "sync" / "tb"), _scalars(tmp_path / "async" / "tb")
    assert two["weight_version"] == sync["weight_version"] == [0.0, 1.0, 2.0]
    assert two["rollout/staleness"] == [0.0, 0.0, 0.0]
    assert two["update/trajectories"] == sync["update/trajectories"] == [12.0, 12.0, 12.0]
    for key in ("reward/mean", "grad_norm", "loss/kl"):  # the global batch's figures
        assert two[key] == pytest.approx(sync[key], rel=1e-4, abs=1e-6), key
    # step 0: its 12 rewards are equal (zero advantages) and k3's gradient at policy = reference
    # is 0; step 2: one group of three has a spread, so batch normalisation must take the whole
    # batch's statistics on each rank (rank 0 holds 8 of the 12 rollouts, rank 1 the other 4)
    assert sync["grad_norm"][0] == 0.0 and all(g > 0 for g in sync["grad_norm"][1:])
    weights = _weights(tmp_path / "async" / "hf")
    assert _max_diff(weights, _weights(tmp_path / "sync" / "hf")) < 1e-5
    assert _max_diff(weights, _weights(Path(tiny_run_overrides[0].split("=", 1)[1]))) > 1e-6


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


@pytest.fixture(scope="module")
def killed_then_resumed(tiny_run_overrides, tmp_path_factory) -> dict:
    """`train.py trainer=fsdp_cpu rollout.mode=async` (max_staleness 1) with rank 0 SIGKILLed
    after its first checkpoint, then resumed with `ckpt_path=last` under `AsyncProbe`: the
    resumed run trains 3 steps, its generator is SIGKILLed after the third, and it stops at the
    fourth. One pair of launches for two tests: what the kill left behind, and the resumed
    run's output, records and checkpoint."""
    from tests.distributed.test_sharded_checkpoint_kill import _step
    from tests.generator.test_async_rollouts import _children_of, _is_tracker

    tmp_path = tmp_path_factory.mktemp("killed_then_resumed")
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    extra = [*ASYNC_BOUND_1, "export_hf=false"]
    env = {"OMP_NUM_THREADS": "1", "PARAVT_COLLECTIVE_RULE": "nccl"}
    first = _args(tiny_run_overrides, run_dir, *extra, "trainer.max_steps=200")
    log = tmp_path / f"killed-{time.monotonic_ns()}.log"
    proc = forkserver.start_script(ROOT / "train.py", first, log, env, ROOT)
    start = time.monotonic()
    while not ((last / "meta.pt").exists() and _step(last) >= 1):  # then kill it mid-run
        if proc.poll() is not None or time.monotonic() - start > 600:
            proc.kill()
            pytest.fail(f"no checkpoint of step 1:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.2)
    children = [p for p in _children_of(proc.pid) if not _is_tracker(p)]
    rank1 = [p for p in children if "train_ddp_process_1" in _cmdline(p)]
    generator = [p for p in children if p not in rank1]
    assert len(rank1) == 1 and len(generator) == 1, [_cmdline(p) for p in children]
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    killed = {
        "generator_gone": gone(generator[0], within_s=15),
        "rank1_gone": gone(rank1[0], within_s=120),
    }
    step = _step(last)
    records = tmp_path / "probe.jsonl"
    probe = "+callbacks.async_probe"
    resumed = forkserver.run(
        [
            str(ROOT / "train.py"),
            *_args(tiny_run_overrides, run_dir, *extra, f"trainer.max_steps={step + 5}"),
            "ckpt_path=last",
            f"{probe}._target_=tests.distributed.async_faults.AsyncProbe",
            f"{probe}.path={records}",
            f"{probe}.kill_generator_after={step + 2}",
        ],
        tmp_path / "resumed_logs",
        ROOT,
        env,
        timeout=900,
    )
    return killed | {
        "step": step,
        "last": last,
        "saved": _step(last),
        "returncode": resumed.returncode,
        "out": resumed.stdout + resumed.stderr,
        "rows": [json.loads(line) for line in records.read_text().splitlines()],
    }


def test_kill_9_of_rank_0_leaves_no_process_and_two_ranks_resume(killed_then_resumed):
    """Rank 0 SIGKILLed mid-run: rank 1 (the launcher's child) and rank 0's generator exit by
    themselves; `ckpt_path=last` resumes both ranks from the sharded checkpoint, with a fresh
    generator sampling under the checkpoint's weights, and loses no update."""
    run = killed_then_resumed
    assert run["generator_gone"], "the generator outlived its trainer"
    assert run["rank1_gone"], "rank 1 outlived rank 0"
    step, out = run["step"], run["out"]
    assert f"Restored all states from the checkpoint at {run['last']}" in out, out[-3000:]
    for rank in (0, 1):
        first = next(r for r in run["rows"] if r["rank"] == rank)
        assert (first["step"], first["weight_version"], first["staleness"]) == (step, step, 0)
    assert run["saved"] == step + 3  # the 3 resumed steps, trained and saved by both ranks


def test_two_ranks_stay_within_the_staleness_bound_and_stop_together_when_the_generator_dies(
    killed_then_resumed,
):
    """max_staleness=1 under FSDP2 (the resumed run above, from step s): rank 0's generator
    runs a step ahead, and every rank trains each step's share of trajectories sampled at most
    1 update back. Then the generator is SIGKILLed after step s + 2: rank 0 cannot take step
    s + 3, and both ranks stop with that error (rank 1 gets it through the broadcast it is
    waiting in, no hang), leaving no process behind."""
    run = killed_then_resumed
    s, out, rows = run["step"], run["out"], run["rows"]
    assert run["returncode"] != 0, out[-3000:]
    assert f"died with exit code -9 before sending step {s + 3}" in out, out[-3000:]
    for rank in (0, 1):
        ranked = [r for r in rows if r["rank"] == rank]
        assert [r["step"] for r in ranked] == [s, s + 1, s + 2], rows  # none after the kill
        assert [r["staleness"] for r in ranked] == [0, 1, 1]  # sampled one update back
        assert [r["weight_version"] for r in ranked] == [s, s, s + 1]
        assert all(r["trajectories"] > 0 for r in ranked)
    generator = {r["generator_pid"] for r in rows if r["rank"] == 0}
    assert len(generator) == 1 and None not in generator
    assert {r["generator_pid"] for r in rows if r["rank"] == 1} == {None}  # rank 0 owns it
    for pid in {r["pid"] for r in rows} | generator:
        assert gone(pid), f"process {pid} outlived the run"


def test_a_trainer_exception_on_rank_1_stops_both_and_the_generator(tiny_run_overrides, tmp_path):
    """An exception in rank 1's first training step (rank 1 does not own the generator): the
    run ends with that error, rank 0 does not wait for ever in its next collective (the weight
    gather) and closes its generator, and no process is left behind.

    The mirror case, an exception on rank 0, has no launch of its own: the raising rank's side
    is rank 0's in test_a_trainer_crash_leaves_no_generator (tests/generator/test_async_rollouts.py:
    the error ends the run, the generator is gone) and this test's rank 1 (it leaves the group at
    once, paravt.parallel.launch.end_job); the other rank's side, rank 1 finding rank 0 gone
    from its next collective and exiting by itself, is the kill -9 test's above (rank 0
    SIGKILLed)."""
    out, rows = _probed_run(tiny_run_overrides, tmp_path, raise_after=0, raise_on_rank=1)
    assert "rank 1 crashed on purpose" in out, out[-3000:]
    assert max(r["step"] for r in rows) <= 1, rows  # nobody trained on for long
    pids = {r["pid"] for r in rows} | {r["generator_pid"] for r in rows if r["generator_pid"]}
    assert len(pids) == 3, rows  # both ranks and the generator were seen
    for pid in pids:
        assert gone(pid), f"process {pid} outlived the run"
