"""Data-parallel rules on one process: prompt shards, padded micro-batch lists, loss scales."""

from __future__ import annotations

import pytest
import torch

from paravt.parallel.distributed import (
    MicroBatch,
    Rank,
    agree_max,
    generate_sync_kwargs,
    global_sum,
    pad_micro_batches,
    shard_prompts,
    token_loss_scale,
)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shards_partition_the_global_batch_in_order(world):
    prompts = [f"p{i}" for i in range(16)]
    shards = [shard_prompts(prompts, r, world) for r in range(world)]
    assert [p for s in shards for p in s] == prompts
    assert {len(s) for s in shards} == {16 // world}


def test_rank_1_of_2_gets_the_second_half():
    # B = 4, W = 2: rank 1 takes prompts 2 and 3 (and so all their G rollouts).
    assert shard_prompts(["a", "b", "c", "d"], 1, 2) == ("c", "d")


def test_single_process_needs_no_process_group():
    assert Rank.current() == Rank(0, 1)
    assert agree_max(3) == 3 and global_sum(2.5) == 2.5
    assert generate_sync_kwargs(torch.nn.Linear(2, 2)) == {}
    # Without other ranks nothing is padded; empty chunks are dropped.
    assert pad_micro_batches([[0, 1], [], [2]]) == [MicroBatch((0, 1)), MicroBatch((2,))]


def test_token_loss_scale_recovers_the_global_token_mean():
    # Rank 0: 3 tokens with per-token loss 1; rank 1: 1 token with loss 5.
    # Global token mean = (3*1 + 1*5) / 4 = 2. FSDP averages the 2 ranks' losses:
    # (scale0 * 1 + scale1 * 5) / 2 = (3/4*2*1 + 1/4*2*5) / 2 = (1.5 + 2.5) / 2 = 2.
    s0, s1 = token_loss_scale(3, 4, 2), token_loss_scale(1, 4, 2)
    assert (s0 * 1.0 + s1 * 5.0) / 2 == pytest.approx(2.0)
    assert token_loss_scale(0, 0, 2) == 0.0


def test_rollout_datamodule_batches_are_sharded_per_rank_with_a_global_step():
    from paravt.data.prompt_datamodule import _StepBatches

    pool = [f"s{i}" for i in range(6)]  # 6 prompts, B = 4: step 1 crosses into epoch 1

    def batches(rank, world):
        data = _StepBatches(pool, 4, seed=3, shuffle=True, start=1, steps=3, rank=rank, world=world)
        return [data[i] for i in range(len(data))]

    whole, r0, r1 = batches(0, 1), batches(0, 2), batches(1, 2)
    assert len(whole) == len(r0) == len(r1) == 3  # every rank reads every step
    for w, a, b in zip(whole, r0, r1, strict=True):
        assert w.step == a.step == b.step and w.epoch == a.epoch == b.epoch
        assert a.samples + b.samples == w.samples and len(a.samples) == 2
    assert [w.step for w in whole] == [1, 2, 3]


def test_every_rank_reads_the_whole_batch_its_share_comes_from():
    """What rank 0's asynchronous generator samples (`whole`) is the union of the ranks' shares,
    with 3 prompts on 2 ranks dealt 2 + 1."""
    from paravt.data.prompt_datamodule import _StepBatches

    pool = [f"s{i}" for i in range(5)]
    ranks = [
        _StepBatches(pool, 3, seed=7, shuffle=True, start=2, steps=2, rank=r, world=2)
        for r in (0, 1)
    ]
    for i in range(2):
        whole = [r.whole(i) for r in ranks]
        assert whole[0] == whole[1] and len(whole[0].samples) == 3
        assert ranks[0][i].samples + ranks[1][i].samples == whole[0].samples
        assert [len(r[i].samples) for r in ranks] == [2, 1]
        # each share knows where it starts in the whole batch (the rollouts' seeds use it)
        assert [r[i].first for r in ranks] == [0, 2] and whole[0].first == 0
