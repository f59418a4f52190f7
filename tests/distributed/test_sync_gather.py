"""Issue 50, finding 8: the weight sync casts each fp32 shard to bf16 before gathering it (half
the traffic of gathering fp32 and casting after), with the same values, and a rank that
discards the gathered weights (`gather_only`, a server checkpoint's non-writing rank) joins at
the same dtype and copies nothing to the host. Two CPU ranks, FSDP2 over gloo
(`tests/distributed/sync_worker.py`); the bytes each rank moves to the host are counted from the
copies it asks for (`.to(cpu)`, `.cpu()`: device-to-host copies on a GPU, no-ops here)."""

from __future__ import annotations

import pytest
import torch

from .launch import launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync_gather")
    return launch(["sync_gather", "-", str(out)], out, world_size=2, timeout=180)


def test_the_sync_gathers_bf16_shards_with_the_values_of_casting_after(ranks):
    for res in ranks:
        # 2 Linear layers: 2 weights + 2 biases, each sharded over the 2 ranks: 4 gathers
        assert res["synced"] == [torch.bfloat16] * 4, res["synced"]
        assert res["got"].keys() == res["expected"].keys()
        for name, tensor in res["got"].items():
            assert tensor.dtype == torch.bfloat16
            assert torch.equal(tensor, res["expected"][name]), name


def test_a_rank_that_discards_the_weights_gathers_at_the_same_dtype(ranks):
    for res in ranks:
        assert res["discarded"] == res["synced"] == [torch.bfloat16] * 4


def test_a_server_checkpoint_gathers_bf16_on_every_rank_and_rank_0_writes_it(ranks):
    """1 + 7: rank 0 writes the rollout server's checkpoint, the other ranks only gather."""
    for res in ranks:
        assert res["checkpoint"] == [torch.bfloat16] * 4, res["checkpoint"]
    written, expected = ranks[0]["written"], ranks[0]["expected"]
    assert written.keys() == expected.keys() and not ranks[1]["written"]
    assert all(torch.equal(written[k], expected[k]) for k in expected)


def test_only_the_rank_that_keeps_the_weights_copies_them_to_the_host(ranks):
    """2 Linear layers: 8*6 + 6 + 6*4 + 4 = 82 parameters, 164 bytes in bf16. Rank 0 copies
    each full tensor to the host once (into the shared copy, into the checkpoint); rank 1,
    which discards them, none (before the fix: the whole model every step, in fp32 first)."""
    assert [r["published_host_bytes"] for r in ranks] == [164, 0]
    assert [r["written_host_bytes"] for r in ranks] == [164, 0]
