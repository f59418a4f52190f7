"""The checked-collective layer: tensors on the device (and of a dtype) the backend requires."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from paravt.parallel import collectives
from paravt.parallel.collectives import CollectiveError, check_tensor


def test_nccl_rule_refuses_cpu_and_float64():
    with pytest.raises(CollectiveError, match="NCCL needs CUDA tensors"):
        check_tensor(torch.zeros(2, dtype=torch.int64), "nccl")
    with pytest.raises(CollectiveError, match="float64"):
        check_tensor(torch.zeros(2, dtype=torch.float64), "nccl", placed=True)
    check_tensor(torch.zeros(2, dtype=torch.float32), "nccl", placed=True)  # built for NCCL


def test_gloo_rule_takes_cpu_tensors():
    check_tensor(torch.zeros(2, dtype=torch.float64), "gloo")


@pytest.fixture
def gloo_group(tmp_path, monkeypatch):
    """A one-process gloo group checked under the simulated NCCL rule."""
    monkeypatch.setenv(collectives.RULE_ENV, "nccl")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_simulated_nccl_accepts_what_the_layer_builds_and_refuses_hand_made_tensors(gloo_group):
    assert collectives.backend_rule() == "nccl"
    assert collectives.collective_device() == torch.device("cpu")  # gloo transport
    assert collectives.reduce_ints([3, 4]) == [3, 4]
    with pytest.raises(CollectiveError, match="NCCL needs CUDA tensors"):
        collectives.all_reduce(torch.tensor([1.0]))  # made by hand, not on the backend's device
    with pytest.raises(CollectiveError, match="float64"):
        collectives.all_reduce(collectives.on_collective_device([1.0], torch.float64))


@pytest.fixture(scope="module")
def each_then_leave(tmp_path_factory) -> tuple[list[dict], Path]:
    """One 2-rank launch: `on_rank0_each`, then `leave_group` waiting for a slow rank 1."""
    from .launch import launch

    out = tmp_path_factory.mktemp("each_then_leave")
    return launch(["each", "-", str(out)], out, world_size=2, timeout=120), out


def _left(out: Path, rank: int) -> tuple[float, float]:
    """(when `rank` arrived at leave_group, when it left)."""
    arrived, left = (float(x) for x in (out / f"left{rank}.txt").read_text().split())
    return arrived, left


def test_leave_group_waits_for_a_slow_peer(each_then_leave):
    _, out = each_then_leave
    assert _left(out, 0)[1] >= _left(out, 1)[0]  # rank 0 left only once rank 1 had arrived


def test_leave_group_on_an_error_does_not_wait_for_a_slow_peer(tmp_path):
    from .launch import launch

    out = tmp_path / "out"  # rank 0 leaves at once; rank 1's barrier then finds no peer and fails
    with pytest.raises(AssertionError, match=r"ranks \[1\] failed"):
        launch(["leave", "nowait", str(out)], out, world_size=2, timeout=120)
    arrived0, left0 = _left(out, 0)
    assert left0 - arrived0 < 1.5  # it did not wait out its peer


def test_on_rank0_each_sends_each_rank_only_its_part_and_rank_0s_error(each_then_leave):
    seen, _ = each_then_leave
    assert [s["got"] for s in seen] == [[10, 11, 12], [13, 14, 15]]
    assert [s["calls"] for s in seen] == [[0], []]  # fetched once, by rank 0
    assert [s["error"] for s in seen] == ["the generator failed"] * 2


def test_a_rank_whose_rollouts_failed_stops_every_rank(each_then_leave):
    """Issue 50, finding 10: with each rank's own engine (in-process vLLM) a failure on one rank
    left the others waiting in the step's collectives (NCCL: 30 minutes)."""
    seen, _ = each_then_leave
    assert seen[0]["settle"] == (
        "trainer rank 1's rollouts failed, so rank 0 stops too (nothing is trained on it): "
        "RuntimeError: vLLM died"
    )
    assert seen[1]["settle"] is None  # the failing rank raises its own error
