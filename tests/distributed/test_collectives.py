"""The checked-collective layer: tensors on the device (and of a dtype) the backend requires."""

from __future__ import annotations

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
    assert collectives.reduce_floats([0.5]) == [0.5]
    with pytest.raises(CollectiveError, match="NCCL needs CUDA tensors"):
        collectives.all_reduce(torch.tensor([1.0]))  # made by hand, not on the backend's device
    with pytest.raises(CollectiveError, match="float64"):
        collectives.all_reduce(collectives.on_collective_device([1.0], torch.float64))
