"""What a checkpoint holds and how sharded ones land: the trainable state without the frozen
reference (unless a cold start made it a copy of the policy), a configurable interval, exact
resume, and the staged-folder + symlink publication of sharded (DCP) saves."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from paravt.modules.checkpoint import (
    SHARDED_METADATA,
    is_complete_checkpoint,
    publish_checkpoint_dir,
    stage_path,
)

_spec = importlib.util.spec_from_file_location(
    "paravt_test_grpo_training", Path(__file__).with_name("test_grpo_training.py")
)
_grpo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_grpo)
train = _grpo.train  # the CPU-scaled run of test_grpo_training.py


def _stage(final: Path, step: int, complete: bool = True) -> Path:
    stage = stage_path(final, step)
    stage.mkdir(parents=True)
    (stage / "__0_0.distcp").write_bytes(os.urandom(64))
    if complete:
        (stage / SHARDED_METADATA).write_bytes(b"m")
    return stage


def test_publish_points_last_at_the_new_folder_and_drops_the_others(tmp_path):
    final = tmp_path / "last.ckpt"
    first = _stage(final, 1)
    publish_checkpoint_dir(first, final)
    assert final.is_symlink() and final.resolve() == first.resolve()
    torn = _stage(final, 2, complete=False)  # a kill mid-save at step 2
    assert is_complete_checkpoint(final) and final.resolve() == first.resolve()
    with pytest.raises(RuntimeError, match="refusing to publish"):
        publish_checkpoint_dir(torn, final)
    second = _stage(final, 3)
    publish_checkpoint_dir(second, final)
    assert final.resolve() == second.resolve()
    assert not first.exists() and not torn.exists()  # older and torn folders are removed
    assert sorted(p.name for p in tmp_path.iterdir()) == [".last-step3.dcp", "last.ckpt"]


def test_publish_replaces_a_folder_written_by_the_old_in_place_writer(tmp_path):
    final = tmp_path / "last.ckpt"
    final.mkdir()
    (final / SHARDED_METADATA).write_bytes(b"old")
    stage = _stage(final, 4)
    publish_checkpoint_dir(stage, final)
    assert final.is_symlink() and (final / "__0_0.distcp").is_file()


def _policy(run) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in run.module.policy.state_dict().items()}


@pytest.mark.slow
def test_checkpoint_has_no_reference_and_resume_is_exact(tmp_path, tiny_qwen3_dir, needle_dir):
    kl = ["algorithm.kl_coef=0.1", "callbacks.checkpoint.every_n_train_steps=2"]
    _, whole = train(tmp_path / "whole", tiny_qwen3_dir, needle_dir, "trainer.max_steps=4", *kl)
    train(tmp_path / "cut", tiny_qwen3_dir, needle_dir, "trainer.max_steps=3", *kl)
    last = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 2  # every 2 steps: step 3 was not saved
    keys = list(ckpt["state_dict"])
    assert any(k.startswith("policy.") for k in keys)
    assert not any(k.startswith("reference.") for k in keys), "the frozen reference was saved"
    assert ckpt["optimizer_states"] and "paravt" in ckpt and "rng" in ckpt["paravt"]
    _, rest = train(
        tmp_path / "cut", tiny_qwen3_dir, needle_dir, "trainer.max_steps=4", *kl, ckpt_path="last"
    )
    assert rest.trainer.global_step == 4
    a, b = _policy(whole), _policy(rest)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    # The reference after the resume is model.path's, as in the uninterrupted run.
    ref_a, ref_b = whole.module.reference.state_dict(), rest.module.reference.state_dict()
    assert all(torch.equal(ref_a[k], ref_b[k]) for k in ref_a)
    assert max(float((a[k] - ref_a[k]).abs().max()) for k in a) > 1e-6  # it really trained


@pytest.mark.slow
def test_a_cold_started_reference_travels_in_the_checkpoint(tmp_path, tiny_qwen3_dir, needle_dir):
    _, run = train(tmp_path, tiny_qwen3_dir, needle_dir, "algorithm.kl_coef=0.1")
    module = run.module
    assert not any(k.startswith("reference.") for k in module.state_dict())
    with torch.no_grad():  # what a cold start does: train the policy, then copy it
        for p in module.policy.parameters():
            p.add_(0.01)
    module.reset_reference()
    state = module.state_dict()
    assert any(k.startswith("reference.") for k in state)
    fresh = _grpo.build_run(
        _grpo.compose_cfg(
            _grpo.CPU_SCALE
            + _grpo.local_paths(tmp_path / "fresh", tiny_qwen3_dir, needle_dir)
            + ["algorithm.kl_coef=0.1"]
        )
    )
    fresh.module.load_state_dict(state)
    got, want = fresh.module.reference.state_dict(), module.reference.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert fresh.module.reference_in_checkpoint  # and its next checkpoints keep it
