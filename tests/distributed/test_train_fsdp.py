"""`train.py trainer=fsdp_cpu`: the user's multi-process command, 2 CPU ranks over gloo.

The same trainer code as `trainer=fsdp` on 8 GPUs (Lightning's ModelParallelStrategy, FSDP2 in
GRPOModule.configure_model, the RolloutDataModule's per-rank prompts, an engine copy per rank),
on the test run's tiny model and needle videos. KL is on so that the reward of every rollout
differs (R - beta KL) and every step really updates. 3 prompts a step: the ranks hold unequal
shares. One uninterrupted 2-step run, which also keeps its step-1 checkpoint; a second run folder
holding that checkpoint as a run stopped after step 1 leaves it, resumed with `ckpt_path=last` to
step 2 (two launches: the stop-at-max_steps-then-resume flow under FSDP2 is
tests/distributed/test_train_fsdp_lora.py's). Collectives are checked under the simulated NCCL
rule.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # 3 runs of train.py
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {
    "trainer": "fsdp_cpu",
    "cold_start": "null",
    "model.freeze_vision": "true",
    "data.batch_size": "3",  # odd: rank 0 takes 2 prompts, rank 1 one (7 on 8 GPUs in small)
    "rollout.group_size": "4",
    "rollout.temperature": "1.2",
    "rollout.agent.max_new_tokens": "32",
    "algorithm.kl_coef": "0.1",
    "algorithm.loss": "ppo_engine_is",  # the GPU recipe's mismatch correction
    # One held-out sample over 2 ranks: rank 1's shard is empty, yet it must join the engine
    # refresh (a collective) that rank 0's evaluation triggers.
    "callbacks.benchmark_validation.limit": "1",
    "callbacks.benchmark_validation.every_n_steps": "2",
}


def _train(train_py, overrides: list[str], run_dir: Path, *extra: str) -> str:
    mine = {k.split("=", 1)[0] for k in SETTINGS}
    base = [o for o in overrides if o.split("=", 1)[0] not in mine]
    args = [*base, *(f"{k}={v}" for k, v in SETTINGS.items()), f"hydra.run.dir={run_dir}", *extra]
    # simulated NCCL checks on gloo (paravt.parallel.collectives)
    proc = train_py(*args, env={"PARAVT_COLLECTIVE_RULE": "nccl"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _keep_every_step(folder: Path) -> list[str]:
    """A second checkpoint callback: Lightning's own, keeping the sharded save of every step."""
    keep = "+callbacks.keep_every_step"
    return [
        f"{keep}._target_=lightning.pytorch.callbacks.ModelCheckpoint",
        f"{keep}.dirpath={folder}",
        f"{keep}.every_n_train_steps=1",
        f"{keep}.save_top_k=-1",
    ]


def _as_stopped_after(step_ckpt: Path, run_dir: Path, step: int) -> None:
    """`run_dir` as a run stopped after `step` leaves it: its sharded save in the hidden staged
    folder, published as checkpoints/last.ckpt (paravt.modules.checkpoint's own layout)."""
    from paravt.modules.checkpoint import publish_checkpoint_dir, stage_path

    final = run_dir / "checkpoints" / "last.ckpt"
    final.parent.mkdir(parents=True)
    shutil.copytree(step_ckpt, stage_path(final, step))
    publish_checkpoint_dir(stage_path(final, step), final)


@pytest.fixture(scope="module")
def runs(train_py, tiny_run_overrides, tmp_path_factory):
    root = tmp_path_factory.mktemp("train_fsdp")
    kept = _keep_every_step(root / "kept")
    whole = _train(train_py, tiny_run_overrides, root / "whole", "trainer.max_steps=2", *kept)
    _as_stopped_after(root / "kept" / "epoch=0-step=1.ckpt", root / "resumed", step=1)
    resumed = _train(
        train_py, tiny_run_overrides, root / "resumed", "trainer.max_steps=2", "ckpt_path=last"
    )
    return root, {"whole": whole, "resumed": resumed}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _policy_weights(ckpt: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The policy's weights in a sharded Lightning checkpoint, under the HF export's names."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(ckpt, tmp / "whole_ckpt.pt")
    state = torch.load(tmp / "whole_ckpt.pt", weights_only=False)["state_dict"]
    return {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_processes_run_and_report_once(runs):
    _, logs = runs
    out = logs["whole"]
    assert "MEMBER: 2/2" in out
    assert out.count("== paravt run") == 1  # the summary comes from rank 0 only
    assert "RL step 2/2" in out


def test_checkpoint_is_sharded_between_the_ranks(runs):
    root, _ = runs
    ckpt = root / "whole" / "checkpoints" / "last.ckpt"
    shards = sorted(ckpt.glob("*.distcp"))
    assert [p.name for p in shards] == ["__0_0.distcp", "__1_0.distcp"]
    sizes = [p.stat().st_size for p in shards]
    for size in sizes:  # each rank wrote its own half of weights and optimiser state
        assert 0.4 * sum(sizes) <= size <= 0.6 * sum(sizes)


def test_resume_after_step_1_equals_the_uninterrupted_run(runs, tmp_path):
    root, logs = runs
    assert "resumed from" in logs["resumed"] and "at step 1" in logs["resumed"]
    whole, resumed = _weights(root / "whole" / "hf"), _weights(root / "resumed" / "hf")
    assert _max_diff(whole, resumed) < 1e-5
    # Step 2 really trained after the resume (the equality is not the trivial one).
    after_1 = _policy_weights(root / "kept" / "epoch=0-step=1.ckpt", tmp_path)
    assert _max_diff(resumed, after_1) > 1e-6


def test_rank0_export_loads_with_transformers(runs, tiny_qwen3_dir):
    from transformers import AutoModelForImageTextToText

    root, _ = runs
    model = AutoModelForImageTextToText.from_pretrained(root / "whole" / "hf")
    assert _max_diff(dict(model.state_dict()), _weights(root / "whole" / "hf")) == 0.0
    initial = _weights(Path(tiny_qwen3_dir))
    assert _max_diff(_weights(root / "whole" / "hf"), initial) > 1e-6


def test_sharded_checkpoint_is_published_atomically_without_the_reference(runs):
    from torch.distributed.checkpoint import FileSystemReader

    root, _ = runs
    folder = root / "resumed" / "checkpoints"
    last = folder / "last.ckpt"
    # The save of step 2 went to its own hidden folder; last.ckpt is a symlink switched to it
    # by one rename, and the folders of older saves (step 1's, the stopped run's) are gone.
    assert last.is_symlink() and last.resolve().name == ".last-step2.dcp"
    assert sorted(p.name for p in folder.iterdir()) == [".last-step2.dcp", "last.ckpt"]
    keys = list(FileSystemReader(str(last)).read_metadata().state_dict_metadata)
    assert any(k.startswith("state_dict.policy.") for k in keys), keys[:5]
    assert not [k for k in keys if ".reference." in f".{k}"], "the frozen reference was saved"
