"""The packed update under FSDP2 (2 CPU ranks over gloo): each rank's packed row, its text
attention per trajectory (`paravt.models.varlen_attention`), gives the padded pass's log-probs
and gradient shards, with and without activation checkpointing (recomputed in backward inside
the context). See `tests/distributed/packed_worker.py`."""

from __future__ import annotations

import pytest

from .launch import launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(tiny_qwen3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed_fsdp")
    return launch(["packed", str(tiny_qwen3_dir), str(out)], out, world_size=2)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_equals_padded_under_fsdp2(ranks, checkpointing):
    assert len(ranks) == 2
    for res in ranks:
        got = res[checkpointing]
        assert got["checkpointing"] is checkpointing
        assert got["inside"] == "paravt_varlen" and got["after"] == "sdpa"
        assert got["same_keys"] and got["grad_scale"] > 1e-4  # a gradient that could differ
        assert got["logp"] < 1e-5, got
        assert got["grad"] < 1e-5, got
