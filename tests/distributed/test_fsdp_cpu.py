"""FSDP2 on 2 CPU ranks over gloo: sharding, bucketed full weights, 2 ranks == 1 rank, resume.

One 2-rank launch (module fixture) serves every test here but the Lightning one: the training
run, then, in the same processes, the resume (a fresh model and optimiser restored from the
step-2 checkpoint on disk). The single-rank reference runs in this process on the unsharded
model with the same loop.
"""

from __future__ import annotations

import pytest
import torch

from . import worker
from .launch import launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tiny_qwen3_dir, tmp_path_factory):
    """(train results per rank, resume results per rank) of the 2-rank launch."""
    root = tmp_path_factory.mktemp("fsdp_cpu")
    train = launch(["train", str(tiny_qwen3_dir), str(root / "train")], root / "train", forked=True)
    return train, [res.pop("resume") for res in train], root


@pytest.fixture(scope="module")
def single_rank(tiny_qwen3_dir):
    """Weights after 2 and 4 steps, and the prompts seen, of the unsharded 1-process loop."""
    model, processor = worker.load(str(tiny_qwen3_dir))
    ids = worker.TokenIds.from_tokenizer(processor.tokenizer)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=worker.LR)
    seen: list = []
    worker.train_steps(model, opt, ids, 0, 2, seen)
    w2 = {k: v.clone() for k, v in model.state_dict().items()}
    worker.train_steps(model, opt, ids, 2, 4, seen)
    return w2, dict(model.state_dict()), seen


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_parameters_are_sharded_policy_and_reference(runs):
    train, _, _ = runs
    for res in train:
        assert res["layer_param_type"] == "DTensor"
        assert res["before"]["policy_local"] == res["policy_full"]
        # 2 ranks: each holds about half (dim-0 shards of odd sizes round up on one rank).
        for name in ("policy", "reference"):
            assert 0.45 * res[f"{name}_full"] <= res[f"{name}_local"] <= 0.55 * res[f"{name}_full"]
    assert sum(r["policy_local"] for r in train) == train[0]["policy_full"]


def test_iter_weights_reproduces_weights_in_buckets(runs):
    train, _, _ = runs
    for res in train:
        assert res["full_keys_match"]
        assert res["full_max_diff"] == 0.0
        sizes = res["bucket_sizes"]
        assert len(sizes) > 1
        # A bucket closes as soon as it reaches 64 KiB: all but the last reached it.
        assert all(s >= 64 << 10 for s in sizes[:-1])


def test_engine_copy_and_full_train_state_hold_the_trained_weights(runs, single_rank):
    train, _, _ = runs
    _, w4, _ = single_rank
    trainable = sum(1 for k in w4 if "visual" not in k)  # AdamW state: one entry per trainable
    for res in train:
        assert res["engine_copied"] == len(w4)
        assert res["engine_diff"] == 0.0
    # The full train state (CPU tensors, for a rank-0 export) exists on rank 0 only.
    assert train[0]["full_state_sizes"] == (len(w4), trainable)
    assert train[1]["full_state_sizes"] == (0, 0)
    assert train[0]["full_state_diff"] == 0.0 and train[0]["full_state_is_plain"]


def test_two_ranks_equal_one_rank_with_the_same_global_batch(runs, single_rank):
    train, _, _ = runs
    w2, w4, seen = single_rank
    assert _max_diff(train[0]["weights_2"], w2) < 1e-5
    assert _max_diff(train[0]["weights_4"], w4) < 1e-5
    assert _max_diff(train[0]["weights_4"], train[1]["weights_4"]) == 0.0
    # The update moved the weights (the equality above is not the trivial one).
    assert _max_diff(w4, w2) > 1e-4
    # Each step's prompts are split between the ranks, none seen twice, none dropped.
    for step, whole in seen:
        halves = [dict(r["seen"])[step] for r in train]
        assert halves[0] + halves[1] == whole


def test_resume_after_step_2_equals_uninterrupted_4_steps(runs):
    train, resume, _ = runs
    for before, after in zip(train, resume, strict=True):
        assert after["resumed_at"] == 2
        assert _max_diff(after["weights_4"], before["weights_4"]) < 1e-5
        # The same prompts, in the same order, on the same rank after the resume.
        assert after["seen"] == [(s, p) for s, p in before["seen"] if s >= 2]


def test_uneven_rollouts_and_micro_batch_counts_do_not_hang(runs):
    train, _, _ = runs
    assert [r["generated"] for r in train] == [2, 24]
    # Rank 0 had 2 short trajectories, rank 1 12; both ran the larger count of micro-batches.
    assert train[0]["micro_batches"] == train[1]["micro_batches"] > 1


def test_rank0_hf_export_loads_with_transformers(runs, single_rank):
    from transformers import AutoModelForImageTextToText

    train, _, root = runs
    model = AutoModelForImageTextToText.from_pretrained(root / "train" / "hf")
    assert _max_diff(dict(model.state_dict()), train[0]["weights_4"]) == 0.0


def test_lightning_model_parallel_strategy_matches_one_rank(tiny_qwen3_dir, tmp_path, single_rank):
    """The same loop in a LightningModule whose configure_model applies shard_policy."""
    ranks = launch(["lightning", str(tiny_qwen3_dir), str(tmp_path)], tmp_path, forked=True)
    w2, _, seen = single_rank
    for res in ranks:
        assert res["layer_param_type"] == "DTensor"
        assert _max_diff(res["weights_2"], w2) < 1e-5
    # Both ranks ran global steps 0 and 1, each on its own half of the prompts.
    for step, whole in seen[:2]:
        assert dict(ranks[0]["seen"])[step] + dict(ranks[1]["seen"])[step] == whole
