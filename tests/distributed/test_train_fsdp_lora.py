"""`train.py trainer=fsdp_cpu model.lora.rank=4`: LoRA RL on 2 CPU ranks through the user's
command, uninterrupted for 2 steps and stopped after step 1 then resumed (`ckpt_path=last`) to
step 2; the settings (KL on, odd prompt count, one held-out sample) are those of
tests/distributed/test_train_fsdp.py. The exports hold the merged model and the adapter."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests import forkserver

from .test_train_fsdp import _max_diff, _train, _weights

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # 3 runs of train.py
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "optimizer.lr=1e-2"]


def _adapter(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "adapter" / "adapter_model.safetensors")


def _train_py(*args: str, env: dict | None = None):
    """`train.py *args` with rank 0 forked from an interpreter holding the heavy imports
    (tests/forkserver.py); its output beside the run folder."""
    run_dir = next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir="))
    return forkserver.run([str(ROOT / "train.py"), *args], Path(f"{run_dir}_logs"), ROOT, env)


@pytest.fixture(scope="module")
def runs(tiny_run_overrides, tmp_path_factory):
    root = tmp_path_factory.mktemp("train_fsdp_lora")
    args = [*tiny_run_overrides, *LORA]
    whole = _train(_train_py, args, root / "whole", "trainer.max_steps=2")
    _train(_train_py, args, root / "resumed", "trainer.max_steps=1")
    shutil.copytree(root / "resumed" / "hf", root / "after_1")
    resumed = _train(_train_py, args, root / "resumed", "trainer.max_steps=2", "ckpt_path=last")
    return root, {"whole": whole, "resumed": resumed}


def test_lora_trains_on_two_ranks_and_resumes(runs, tiny_qwen3_dir):
    root, logs = runs
    assert "MEMBER: 2/2" in logs["whole"] and "RL step 2/2" in logs["whole"]
    assert "resumed from" in logs["resumed"]
    whole, resumed = _adapter(root / "whole" / "hf"), _adapter(root / "resumed" / "hf")
    assert len(whole) == 2 * 2 * 7  # 2 layers x 7 projections x (A, B)
    assert _max_diff(whole, resumed) < 1e-5
    assert _max_diff(resumed, _adapter(root / "after_1")) > 1e-6  # step 2 trained after resume
    # The merged export: the base model's names, the adapters folded in.
    merged, initial = _weights(root / "whole" / "hf"), _weights(Path(tiny_qwen3_dir))
    assert sorted(merged) == sorted(initial)
    assert _max_diff(merged, initial) > 1e-6
    assert _max_diff(merged, _weights(root / "resumed" / "hf")) < 1e-5
