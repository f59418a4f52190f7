"""The result channel of the asynchronous generator (paravt/modules/async_worker.py), with real
spawned children that stand in for `generator_main`: a child killed while it is sending a
result must end `take` with the generator's death, not leave the trainer reading half a message
for ever (a multiprocessing Queue keeps a write end of its pipe in the reader too, so the reader
never sees EOF); a result sent whole before the child dies is still delivered; and a child
alive but silent fails `take` after `rollout.generator_timeout_s`."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from paravt.modules.async_worker import AsyncGenerator, GeneratorError, GenResult, _Outbox

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
