"""The demo still learns in async mode (a generator process one step ahead, the decoupled
loss; and with partial rollouts, trajectories resumed across weight syncs), as a user runs it:
`python train.py rollout.mode=async ...` from an empty
folder, the summary's held-out gain over both frame budgets read from its output."""

from __future__ import annotations

import re

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.slow

GAIN = re.compile(r"held-out accuracy, all budgets: ([\d.]+) -> ([\d.]+) \(([+-][\d.]+) points")


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "partial"])
def test_the_demo_learns_in_async_mode(tmp_path, train_py, partial):
    out = train_py(
        "rollout.mode=async",
        "rollout.max_staleness=1",
        "algorithm.loss=decoupled_ppo",
        f"rollout.partial={partial}",
        "name=demo_async",
        cwd=tmp_path,
        timeout=1500,
        env={"OMP_NUM_THREADS": "2"},  # the generator and the trainer split the 2 cores
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = GAIN.search(out.stdout)
    assert found, out.stdout[-3000:]
    before, after, points = (float(x) for x in found.groups())
    assert points >= 15.0 and after > before  # the bar: +15 points held-out through RL
    tb = [p.parent for p in (tmp_path / "runs" / "demo_async").rglob("events.out.tfevents*")]
    acc = EventAccumulator(str(tb[0]), size_guidance={"scalars": 0})
    acc.Reload()
    staleness = [e.value for e in acc.Scalars("rollout/staleness")]
    assert len(staleness) == 40 and max(staleness) <= 1  # the bound held at every step
    per_token = [e.value for e in acc.Scalars("rollout/token_staleness_max")]
    assert len(per_token) == 40 and max(per_token) <= 1  # for every trained token too
    assert sum(staleness) > 0  # and the generator did run ahead of the trainer
