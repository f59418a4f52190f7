"""Finding 3: the GPU recipe keeps fp32 master weights, so an lr-2e-6 Adam step is not lost.

Two CPU ranks (FSDP2 over gloo) take one AdamW step at the paper's lr 2e-6 under the recipe's
precision code (bf16 checkpoint, `fp32_master`, `MixedPrecisionPolicy(bf16, fp32)`), under
plain fp32, and as `precision=bf16-true` did (bf16 weights and moments). See
`tests/distributed/precision_worker.py`.
"""

from __future__ import annotations

import pytest
import torch

from .launch import launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(tiny_qwen3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("precision")
    return launch(["precision", str(tiny_qwen3_dir), str(out)], out, world_size=2)


def test_recipe_changes_the_same_share_of_weights_as_fp32(ranks):
    for res in ranks:
        fp32, recipe = res["fp32"]["changed_share"], res["recipe"]["changed_share"]
        assert fp32 > 0.5, fp32  # Adam moves every weight with a gradient (rare tokens: none)
        assert recipe == pytest.approx(fp32, abs=0.02)
        # bf16 master weights lose most of the step (the finding): far fewer weights move.
        assert res["bf16_true"]["changed_share"] < 0.5 * fp32, res["bf16_true"]["changed_share"]


def test_recipe_dtypes_master_grad_state_fp32_compute_bf16(ranks):
    for res in ranks:
        seen = res["recipe"]["dtypes"]
        assert seen["param"] == seen["grad"] == seen["exp_avg"] == torch.float32
        assert seen["compute"] == torch.bfloat16  # FSDP2 casts the weights for compute
        assert set(seen["rotary"].values()) == {torch.float32}
        assert res["fp32"]["dtypes"]["compute"] == torch.float32
        assert res["bf16_true"]["dtypes"]["exp_avg"] == torch.bfloat16
