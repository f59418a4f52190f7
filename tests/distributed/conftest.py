"""Fixtures of the distributed tests that run in this process (the others launch ranks)."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist


@pytest.fixture
def one_rank_group():
    """A 1-rank gloo group in this process: FSDP2's sharded code paths (DTensors, the
    `full_tensor` collectives) run for real, without launching ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
