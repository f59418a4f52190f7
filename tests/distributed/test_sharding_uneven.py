"""Prompt shares when the global batch does not divide over the ranks (7 prompts on 8 GPUs)."""

from __future__ import annotations

import pytest

from paravt.parallel.distributed import mean_over_ranks, shard_bounds, shard_prompts


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 9])
@pytest.mark.parametrize("batch", [0, 1, 3, 7, 8, 13])
def test_shares_partition_the_batch_in_order_and_differ_by_at_most_one(batch, world):
    prompts = [f"p{i}" for i in range(batch)]
    shares = [shard_prompts(prompts, r, world) for r in range(world)]
    assert [p for s in shares for p in s] == prompts  # every prompt once, in order
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra prompts go to the first ranks


def test_paper_recipe_seven_prompts_on_eight_ranks():
    shares = [shard_bounds(7, r, 8) for r in range(8)]
    assert shares[:7] == [(r, r + 1) for r in range(7)]
    assert shares[7] == (7, 7)  # the last rank generates nothing, runs zero-weight passes


def test_bad_rank_or_batch_is_refused():
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        shard_bounds(4, 2, 2)
    with pytest.raises(ValueError, match="batch_size must be >= 0"):
        shard_bounds(-1, 0, 2)


def test_one_rank_metrics_pass_through():
    assert mean_over_ranks({"a": 1.5}, weight=3) == {"a": 1.5}
