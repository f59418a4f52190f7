"""`train.py trainer=fsdp_cpu rollout.mode=stream`: an FSDP2 trainer on 2 CPU ranks (gloo) with
rank 0's streaming generator. Every rank joins the gather of the published weights; rank 0
takes each step's batch of whole groups and each rank trains its share (3 groups a step:
2 + 1). Collectives are checked under the simulated NCCL rule (tests/distributed/
test_async_fsdp.py's harness)."""

from __future__ import annotations

import pytest

from tests.distributed.test_async_fsdp import _train
from tests.distributed.test_train_fsdp_vllm import _scalars

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_two_ranks_stream_trains_whole_groups_within_the_bound(tiny_run_overrides, tmp_path):
    out = _train(
        tiny_run_overrides,
        tmp_path / "stream",
        "trainer=fsdp_cpu",
        "rollout.mode=stream",
        "rollout.max_staleness=1",
        "algorithm.loss=decoupled_ppo",
        "rollout.agent.max_new_tokens=8",
    )
    assert "MEMBER: 2/2" in out and out.count("== paravt run") == 1
    two = _scalars(tmp_path / "stream" / "tb")
    # three steps, each batch sampled from the weights of step t or t - 1 (its oldest token)
    assert len(two["weight_version"]) == 3 and two["weight_version"][0] == 0.0
    assert all(t - v in (0.0, 1.0) for t, v in enumerate(two["weight_version"]))
    # 3 whole groups of G=4 a step, over both ranks
    assert two["update/trajectories"] == [12.0, 12.0, 12.0]
    assert max(two["rollout/token_staleness_max"]) <= 1.0  # at every step, token by token
    assert max(two["rollout/staleness"]) <= 1.0
