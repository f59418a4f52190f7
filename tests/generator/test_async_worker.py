"""The result channel of the asynchronous generator (paravt/generator/worker.py), with real
spawned children that stand in for `generator_main`: a child killed while it is sending a
result must end `take` with the generator's death, not leave the trainer reading half a message
for ever (a multiprocessing Queue keeps a write end of its pipe in the reader too, so the reader
never sees EOF); a result sent whole before the child dies is still delivered; and a child
alive but silent fails `take` after `rollout.generator_timeout_s`. Under a W-rank launch the
child is no rank: it drops the launcher's variables and builds on the trainer rank's device."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from paravt.generator.worker import (
    AsyncGenerator,
    GeneratorError,
    GeneratorSpec,
    GenResult,
    _Outbox,
    generator_device,
    standalone_env,
)

pytestmark = pytest.mark.timeout(120)
BIG = 8 << 20  # bytes: far more than a pipe holds, so the send blocks until the reader reads


def _result(step: int, payload: int) -> GenResult:
    return GenResult(step, 0, (), {"payload": "x" * payload}, 0.0, {})


def killed_while_sending(spec, weights, tasks, conn, max_pending, parent):
    """Starts sending a result larger than the pipe, then dies by SIGKILL mid-message."""
    outbox = _Outbox(conn, max_pending)
    outbox.put(_result(0, BIG))
    time.sleep(1.0)  # the sender is blocked inside the message: nobody reads yet
    os.kill(os.getpid(), signal.SIGKILL)


def sends_then_dies(spec, weights, tasks, conn, max_pending, parent):
    """Sends one whole result (waiting until it is out), then dies by SIGKILL."""
    outbox = _Outbox(conn, max_pending)
    outbox.put(_result(0, 1000))
    outbox.close()
    os.kill(os.getpid(), signal.SIGKILL)


def _take_within(gen: AsyncGenerator, step: int, seconds: float, timeout_s: float | None = None):
    """`gen.take(step, timeout_s)` in a thread: (its result or exception); fails the test on a
    hang."""
    box: list = []

    def run():
        try:
            box.append(gen.take(step, timeout_s))
        except Exception as error:  # handed to the test
            box.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"take({step}) still waiting after {seconds} s: the trainer would hang"
    return box[0]


def test_a_child_killed_in_the_middle_of_a_result_ends_take_with_its_death():
    gen = AsyncGenerator(None, None, max_pending=1, main=killed_while_sending)
    try:
        gen.process.join(30)
        assert gen.process.exitcode == -signal.SIGKILL
        got = _take_within(gen, 0, 20)
        assert isinstance(got, GeneratorError), got
        assert f"(pid {gen.pid}) died with exit code -9 before sending step 0" in str(got)
    finally:
        gen.close()


def test_a_result_sent_whole_before_the_child_dies_is_delivered():
    gen = AsyncGenerator(None, None, max_pending=1, main=sends_then_dies)
    try:
        gen.process.join(30)
        assert gen.process.exitcode == -signal.SIGKILL
        got = _take_within(gen, 0, 20)
        assert not isinstance(got, Exception), got
        result, _ = got
        assert result.step == 0 and len(result.video_errors["payload"]) == 1000
        # then the death, when the next step is due
        assert "died with exit code -9 before sending step 1" in str(_take_within(gen, 1, 20))
    finally:
        gen.close()


def test_close_does_not_wait_for_a_child_stuck_sending_a_result_nobody_reads():
    gen = AsyncGenerator(None, None, max_pending=1, main=killed_while_sending)
    time.sleep(0.3)  # the child is blocked in its send
    t0 = time.perf_counter()
    gen.close(timeout_s=5.0)
    assert not gen.process.is_alive()
    assert time.perf_counter() - t0 < 5.0  # stopped, not waited out


def never_sends(spec, weights, tasks, conn, max_pending, parent):
    """Alive and silent: a generator stuck in its engine."""
    time.sleep(120)


def test_a_generator_that_sends_nothing_fails_take_after_the_timeout():
    gen = AsyncGenerator(None, None, max_pending=1, main=never_sends)
    try:
        t0 = time.perf_counter()
        got = _take_within(gen, 0, 30, timeout_s=1.5)
        assert isinstance(got, GeneratorError), got
        assert 1.5 <= time.perf_counter() - t0 < 10
        assert "is running but sent no rollouts for step 0 in 1.5 s" in str(got)
        assert "rollout.generator_timeout_s" in str(got)
    finally:
        gen.close(timeout_s=1.0)
    assert not gen.process.is_alive()


@pytest.mark.parametrize("bad", [0, -5.0])
def test_the_generator_timeout_must_be_positive_or_null(bad):
    from paravt.modules.rollout_datamodule import RolloutConfig

    assert RolloutConfig(generator_timeout_s=None).generator_timeout_s is None
    with pytest.raises(ValueError, match=r"rollout.generator_timeout_s must be > 0 seconds"):
        RolloutConfig(generator_timeout_s=bad)


def test_the_generator_goes_on_the_trainer_ranks_gpu_else_the_cpu():
    import torch  # not at the top: the stand-in children import this module and must start fast

    assert generator_device("cpu") == "cpu"
    assert generator_device(torch.device("cuda", 3)) == "cuda:3"


def test_the_child_environment_drops_the_launch_and_narrows_to_one_gpu():
    launched = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1",
        "TORCHELASTIC_RUN_ID": "x",
        "SLURM_PROCID": "0",
        "VLLM_DP_SIZE": "2",
        "PATH": "/bin",
    }
    env, device = standalone_env(launched | {"CUDA_VISIBLE_DEVICES": "4,5"}, "cuda:1")
    assert (env, device) == ({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "5"}, "cuda:0")
    assert standalone_env(launched, "cuda:1") == (
        {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1"},
        "cuda:0",
    )
    assert standalone_env(launched, "cpu") == ({"PATH": "/bin"}, "cpu")
    with pytest.raises(ValueError, match="GPU 2 is not among CUDA_VISIBLE_DEVICES=4,5"):
        standalone_env({"CUDA_VISIBLE_DEVICES": "4,5"}, "cuda:2")


def records_what_it_builds_under(spec, weights, tasks, conn, max_pending, parent):
    """The real `generator_main`, with `_build` replaced by a recorder of what the engine would be
    built under (the process's launch world, the vLLM placement arguments it decides, the
    device `_build` is handed); `spec.policy` names the record's file (nothing is loaded)."""
    from paravt.generator import worker as async_worker
    from paravt.rollout.engine import EngineConfig
    from paravt.rollout.engines.vllm import placement_kwargs
    from paravt.rollout.engines.vllm_launch import launch_world

    def build(spec, weights, device="cpu", stack=None):
        world = launch_world()
        record = {
            "world": list(world),
            "vllm_placement": placement_kwargs(EngineConfig(name="vllm")),
            "device": device,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        with open(spec.policy, "w") as f:
            json.dump(record, f)
        return None, None, None

    async_worker._build = build
    async_worker.generator_main(spec, weights, tasks, conn, max_pending, parent)


def test_a_generator_started_by_rank_0_of_two_builds_a_standalone_engine(tmp_path, monkeypatch):
    """The GPU decisions are forced (PARAVT_ASSUME_GPU=1, inherited by the child): a GPU's
    placement, and no external launcher for the trainer's 2-rank world."""
    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PARAVT_ASSUME_GPU", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    out = tmp_path / "built.json"
    spec = GeneratorSpec(str(out), None, None, None, (), 1, device="cuda:1")  # rank 0 on cuda:1
    gen = AsyncGenerator(spec, None, max_pending=1, main=records_what_it_builds_under)
    try:
        end = time.monotonic() + 60
        while not out.exists() and gen.process.is_alive() and time.monotonic() < end:
            time.sleep(0.2)
        assert out.exists(), "the generator built nothing"
    finally:
        gen.close()
    # one process of its own, vLLM's single-process engine, on the trainer rank's GPU only
    assert json.loads(out.read_text()) == {
        "world": [0, 1],
        "vllm_placement": {
            "gpu_memory_utilization": 0.5,
            "tensor_parallel_size": 1,
            "enable_sleep_mode": False,
        },
        "device": "cuda:0",
        "visible": "7",
    }
