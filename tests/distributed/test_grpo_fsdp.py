"""GRPOModule itself under Lightning's ModelParallelStrategy (FSDP2, 2 CPU ranks over gloo).

The same fixed rollout batches (real rollouts of the tiny model through the agent loop, sampled
once here) are trained for 5 steps on 1 process and on 2 (steps 4 and 5 with 3 and 1 prompts:
uneven shares, rank 1 empty in step 5), each rank taking its half of every
step's prompts as the RolloutDataModule serves them. KL (a sharded reference), the structural
anchor and many token-budget micro-batches are on; in step 3 all of rank 0's groups have zero
reward variance and are dropped, so rank 0 trains nothing while rank 1 runs its micro-batches:
the zero-weight dummy passes must keep the collectives in step (no hang) and leave the result
equal to the one-process update. The 2-rank module starts as a meta-device skeleton (rank 0
alone reads the checkpoint and fills the shards), as `train.py trainer=fsdp` builds it.
"""

from __future__ import annotations

import pytest
import torch

from . import worker
from .launch import one_and_two_ranks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tiny_qwen3_dir, needle_samples, tmp_path_factory):
    """(1-rank results, 2-rank results per rank) of GRPOModule on the same batches."""
    root = tmp_path_factory.mktemp("grpo_fsdp")
    batches = worker.rollout_batches(str(tiny_qwen3_dir), needle_samples, steps=2, group=4)
    batches.append(worker.without_variance(batches[1], step=2, prompts=2))
    # Odd prompt counts (the paper's 7 prompts on 8 ranks): 3 prompts deal 2 + 1, one prompt
    # leaves rank 1 with nothing to generate or train (zero-weight passes only).
    batches.append(worker.first_prompts(batches[0], step=3, prompts=3))
    batches.append(worker.first_prompts(batches[1], step=4, prompts=1))
    torch.save(batches, root / "batches.pt")
    one, two = one_and_two_ranks(["grpo", str(tiny_qwen3_dir)], root, str(root / "batches.pt"))
    return one, two


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_ranks_update_like_one_rank(runs, tiny_qwen3_dir):
    one, two = runs
    initial = dict(worker.load(str(tiny_qwen3_dir))[0].state_dict())
    assert _max_diff(one["weights"], initial) > 1e-4  # the 5 updates moved the weights
    for rank in two:
        assert _max_diff(rank["weights"], one["weights"]) < 1e-5
    # Step 5 was one prompt: rank 1 had no rollouts; its metrics weigh nothing.
    assert [r["trajectories"][-1] for r in two] == [4, 0]


def test_collectives_follow_the_simulated_nccl_rule(runs):
    _, two = runs
    for rank in two:  # a hand-made CPU float64 tensor is refused, as NCCL would
        assert "NCCL needs CUDA tensors" in rank["rogue_collective"]


def test_metrics_are_the_global_batch_s(runs):
    one, two = runs
    keys = ("reward/mean", "f_tau", "kappa", "grad_norm", "update/trajectories", "kl/reference")
    assert len(one["metrics"]) == 5
    for rank in two:
        for k in keys:
            got = [m[k] for m in rank["metrics"]]
            want = [m[k] for m in one["metrics"]]
            assert got == pytest.approx(want, rel=1e-4, abs=1e-6), k
    # Step 3: rank 0's two groups were dropped (zero variance), rank 1's trained.
    assert [m["update/trajectories"] for m in one["metrics"]][:3] == [16.0, 16.0, 8.0]
    assert one["metrics"][2]["advantage/zero_variance_share"] == 0.5


def test_meta_device_load_restores_every_buffer(runs):
    one, two = runs  # rank 0 alone read the checkpoint; rotary frequencies are in no state dict
    assert one["buffers"] and sorted(one["buffers"]) == sorted(two[1]["buffers"])
    for name, value in one["buffers"].items():
        assert torch.equal(two[1]["buffers"][name], value), name


def test_policy_and_reference_are_sharded(runs):
    one, two = runs
    assert one["policy_local"] == one["full"]
    assert sum(r["policy_local"] for r in two) == one["full"]
    for rank in two:
        for name in ("policy_local", "reference_local"):
            assert 0.45 * rank["full"] <= rank[name] <= 0.55 * rank["full"]
