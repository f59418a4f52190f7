"""The streaming scheduler's rules (paravt.rollout.sync.stream_buffer), event by event."""

from __future__ import annotations

import random

import pytest

from paravt.rollout.sync.stream_buffer import StreamLimits, StreamScheduler


def _sched(**kw) -> StreamScheduler:
    return StreamScheduler(StreamLimits(**kw))


def test_admission_counts_trajectory_slots_buffer_room_and_the_staleness_gate():
    # slots: 8 // G=4 = 2 groups; room and gate: (2 // 1 + 1) * 2 = 6 groups
    s = _sched(group_size=4, batch_groups=2, max_concurrent=8, max_staleness=2)
    assert s.admissible() == 2
    s.start(0), s.start(1)
    assert (s.in_flight, s.admissible()) == (8, 0)
    with pytest.raises(RuntimeError, match="admission is closed"):
        s.start(2)
    s.finish(0), s.finish(0)  # 2 slots free: not a whole group's 4
    assert s.admissible() == 0
    s.finish(0), s.finish(0)  # group 0 is buffered: 4 slots
    assert (s.buffered, s.in_flight, s.admissible()) == (1, 4, 1)
    # an explicit buffer bound of 2 groups: 1 buffered + 1 running leave no room
    t = _sched(group_size=4, batch_groups=2, max_concurrent=64, buffer_groups=2)
    t.start(0), t.start(1)
    assert t.admissible() == 0


def test_staleness_zero_is_sync_nothing_starts_before_the_update_is_published():
    s = _sched(group_size=2, batch_groups=2, max_staleness=0)
    assert s.admissible() == 2  # gate (0 + 0 + 1) * 2
    s.start(0), s.start(1)
    for g in (0, 0, 1, 1):
        s.finish(g)
    s.publish(0)  # step 0's publication: its weights are the initial ones
    batch = s.take()
    assert (batch.groups, batch.staleness, batch.dropped) == ((0, 1), (0, 0), ())
    assert s.admissible() == 0  # gate (0 + 0 + 1) * 2 - 2 accepted: step 1 waits for update 0
    s.publish(1)
    assert s.admissible() == 2  # (1 + 0 + 1) * 2 - 2
    s.load()
    assert s.start(2) == 1  # sampled by the new weights


def test_a_running_group_past_the_bound_is_doomed_at_publication_and_ignored_after():
    s = _sched(group_size=1, batch_groups=1, max_staleness=1)
    s.start(0), s.start(1)  # gate (1 + 0 + 1) * 1 = 2, both at version 0
    assert s.finish(1)
    s.publish(0)
    assert s.take().groups == (1,)
    assert s.publish(1) == ()  # group 0: 1 - 0 = 1 update behind, within the bound
    s.load()
    assert s.start(2) == 1
    s.finish(2)
    assert s.take().staleness == (0,)
    assert s.publish(2) == (0,)  # 2 - 0 = 2 > 1: dropped while running
    assert (s.dropped, s.in_flight, s.finish(0), s.buffered) == (1, 0, False, 0)


def test_a_buffered_group_past_the_bound_is_dropped_at_the_take_and_replaced():
    # 2 updates a step, bound 3: lag 3 // 2 = 1 step; a version-0 group is 4 behind at step 2
    s = _sched(group_size=1, batch_groups=1, max_staleness=3, updates_per_step=2)
    s.start(0), s.start(1)
    s.finish(1)
    s.publish(0)
    assert s.take().groups == (1,)
    s.publish(2)
    s.load()
    s.start(2)  # gate (1 + 1 + 1) * 1 - 1 accepted - 1 running = 1
    s.finish(2), s.finish(0)  # buffer: [2 (v2), 0 (v0)]
    assert s.take().groups == (2,)
    s.publish(4)
    assert not s.ready()  # group 0: 4 - 0 = 4 > 3
    assert s.admissible() == 1  # (2 + 1 + 1) * 1 - 3 accepted
    s.load()
    s.start(3), s.finish(3)
    batch = s.take()
    assert (batch.groups, batch.dropped, s.dropped, s.accepted) == ((3,), (0,), 1, 3)
    # the dropped group no longer counts against the gate: (2 + 1 + 1) - 3 = 1 may start
    assert s.admissible() == 1


def test_drain_holds_the_weights_until_nothing_is_in_flight_and_starts_nothing_meanwhile():
    for on_sync, loads_now in (("continue", True), ("drain", False)):
        s = _sched(group_size=1, batch_groups=1, max_staleness=1, on_sync=on_sync)
        s.start(0), s.start(1)
        s.finish(0)
        s.publish(0)
        s.take()
        s.publish(1)
        assert s.may_load() is loads_now
        assert (s.admissible() > 0) is loads_now
        s.finish(1)
        assert s.may_load()
        s.load()
        assert not s.may_load() and s.admissible() > 0


def test_finish_keeps_the_oldest_version_a_trajectory_reports():
    s = _sched(group_size=2, batch_groups=1, max_staleness=2)
    s.publish(5)
    s.load()
    s.start(0)
    s.finish(0, version=5)
    s.finish(0, version=4)  # resumed after a sync... its oldest token is older
    assert s.take().versions == (4,)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_concurrent": 3}, "cannot hold one group"),
        ({"buffer_groups": 1}, "never hold one batch"),
        ({"on_sync": "abort"}, "on_sync must be one of"),
        ({"max_staleness": -1}, "max_staleness must be >= 0"),
        ({"batch_groups": 0}, "batch_groups and updates_per_step >= 1"),
    ],
)
def test_limits_that_cannot_work_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        StreamLimits(**({"group_size": 4, "batch_groups": 2} | kw))


def test_a_random_run_keeps_every_bound_and_loses_no_group():
    """Random finishing orders and trainer timing: whatever happens, no trained group is past
    the bound, slots and room hold, and every started group is running, buffered, taken or
    dropped."""
    rng = random.Random(0)
    lim = StreamLimits(group_size=2, batch_groups=3, max_concurrent=8, max_staleness=2)
    s, version, nxt = StreamScheduler(lim), 0, 0
    s.publish(version)
    for _ in range(2000):
        event = rng.random()
        if event < 0.4 and s.admissible():
            s.start(nxt)
            nxt += 1
        elif event < 0.8 and s.running:
            s.finish(rng.choice(list(s.running)), version=None)
        elif s.ready():
            assert max(s.take().staleness) <= 2
            version += 1
            s.publish(version)
        if s.may_load() and rng.random() < 0.5:
            s.load()
        assert s.in_flight <= 8 and s.buffered + len(s.running) <= lim.capacity
        assert s.started == s.taken + s.dropped + s.buffered + len(s.running)
    assert s.batches > 50 and s.dropped > 0  # the run went far and the bound did bite
