"""The memory plan's terms beyond the model state (issue 50, finding 5): FSDP2's root unit held
through the backward, lm_head's unsharded gradient, the vision feature caches, the CUDA context,
cuBLAS workspaces and NCCL communicators; and the paper's recipe fitting an 80 GB GPU with them.

Qwen3-VL-8B by hand: one decoder layer 2*4096^2 + 2*4096*1024 + 3*4096*12288 = 192,937,984;
36 of them 6,945,767,424; embeddings and lm_head 151,936 * 4,096 = 622,329,856 each, so the
language model is 8,190,427,136 and the vision tower 8.77e9 - that = 579,572,864.
"""

from __future__ import annotations

import pytest

from paravt.run.memory_plan import GIB, PUBLISHED, plan
from paravt.run.recipe import main
from paravt.run.recipe_memory import plan_inputs
from paravt.run.recipe_problems import compose

PAPER = ["experiment=paragrpo", "trainer.devices=8", "model.path=/m/Qwen3-VL-8B-Instruct"]
HEAD = 151_936 * 4_096  # 622,329,856 parameters
VISION = 8_770_000_000 - 8_190_427_136  # 579,572,864 parameters
MIB = 1024**2


def paper_plan(*overrides: str) -> dict[str, float]:
    return plan(PUBLISHED["qwen3_vl_8b"], plan_inputs(compose([*PAPER, *overrides]), 80.0))


def test_each_new_term_of_the_8b_plan_by_hand():
    numbers = paper_plan()
    # root unit: (2 * 622,329,856 + 579,572,864) = 1,824,232,576 parameters in bf16 = 3.40 GiB
    root = numbers["update: root unit bf16 (embed, lm_head, vision)"]
    assert root == 2 * 1_824_232_576 == 2 * (2 * HEAD + VISION)
    assert numbers["update: lm_head gradient bf16 (unsharded)"] == 2 * HEAD  # 1.16 GiB
    # rollout.vision_cache.feature_bytes 1 GiB for the policy's cache and the reference's
    assert numbers["vision feature caches (policy + reference)"] == 2 * GIB
    assert numbers["CUDA context and kernel modules"] == GIB
    assert numbers["cuBLAS/cuBLASLt workspaces"] == 256 * MIB  # 4 streams x 2 x 32 MiB
    # the default group, the FSDP mesh's data-parallel group and vLLM's world group
    assert numbers["NCCL communicators (3 x 768 MiB)"] == 3 * 768 * MIB


def test_the_update_phase_holds_the_root_unit_and_lm_heads_gradient():
    """With the engine asleep the update is every resident term but the engine's, the
    checkpointed activations, the root unit and lm_head's gradient."""
    n = paper_plan()
    engine = n["engine weights bf16 (vLLM, full copy)"] + n["engine KV cache (vLLM reservation)"]
    assert engine == pytest.approx(40e9)  # gpu_memory_utilization 0.5 of 80 GB
    resident = n["peak rollout phase"] - engine
    extra = 2 * (2 * HEAD + VISION) + 2 * HEAD
    acts = n["update: activations, checkpointing"]
    assert n["peak update phase"] == pytest.approx(resident + acts + extra)


@pytest.mark.parametrize(
    ("overrides", "key", "value"),
    [
        (["rollout.vision_cache.enabled=false"], "vision feature caches (policy + reference)", 0),
        (["algorithm.kl_coef=0"], "vision feature cache", GIB),  # no reference, one cache
        (["trainer.devices=1"], "NCCL communicators (0 x 768 MiB)", 0),  # one rank, no group
        (["rollout/engine=hf"], "NCCL communicators (2 x 768 MiB)", 2 * 768 * MIB),
    ],
)
def test_the_terms_follow_the_config(overrides, key, value):
    assert paper_plan(*overrides)[key] == value


def test_the_8b_recipe_fits_an_80gb_gpu_with_4_gib_headroom():
    """Rollout phase (the peak, the engine asleep during the update): model state
    4.385e9 + 4.095e9 + 8.190e9 (master, gradients, moments of 8.19e9 trainable) + 2.1925e9
    (reference) + 0.772e9 (two layers) + 40e9 (the engine's 0.5 share) = 59.635e9 B = 55.54 GiB,
    + 2 (caches) + 1 (context) + 0.25 (cuBLAS) + 2.25 (NCCL) = 61.04 GiB of 74.51: 13.47 GiB."""
    numbers = paper_plan()
    assert numbers["peak"] == numbers["peak rollout phase"]
    assert numbers["headroom"] / GIB == pytest.approx(13.47, abs=0.01)
    assert numbers["headroom"] >= 4 * GIB


def test_awake_during_the_update_the_8b_recipe_does_not_fit(capsys):
    """Without sleep mode the update adds the engine's 37.25 GiB to its 43.7: 81.0 GiB."""
    assert paper_plan("rollout.engine.enable_sleep_mode=false")["headroom"] < 0
    assert main([*PAPER, "rollout.engine.enable_sleep_mode=false"]) == 2
    out = capsys.readouterr().out
    assert "headroom -6.5 GiB per GPU" in out and "rollout.engine.enable_sleep_mode=true" in out


def test_check_recipe_prints_the_headroom(capsys):
    assert main(PAPER) == 0
    assert "  headroom 13.5 GiB per GPU" in capsys.readouterr().out


# ---- rank 0's asynchronous generator (issue 50, finding 8) ------------------------------------
ONE_PLUS_SEVEN = ["experiment=paragrpo_1p7", "model.path=/m/Qwen3-VL-8B-Instruct"]


def plan_of(*overrides: str) -> dict[str, float]:
    return plan(PUBLISHED["qwen3_vl_8b"], plan_inputs(compose(list(overrides)), 80.0))


def test_the_1p7_generator_holds_nothing_on_rank_0s_gpu_with_checkpoint_syncs(capsys):
    """Its policy is a skeleton over the shared host copy; the plan says so, and counts none
    of the 16.3 GiB bf16 copy it kept before."""
    numbers = plan_of(*ONE_PLUS_SEVEN)
    assert not [k for k in numbers if "generator" in k]
    assert main(ONE_PLUS_SEVEN) == 0
    assert "rank 0's async generator holds nothing on a GPU" in capsys.readouterr().out


def test_the_1p7_generator_sending_over_nccl_counts_its_context_bucket_and_communicator():
    """1 GiB context + a bucket below 256 MiB + the largest tensor (151,936 x 4,096 in bf16:
    1,244,659,712 B) + 768 MiB: 3,392,143,360 B (3.16 GiB) more on rank 0's GPU."""
    base = plan_of(*ONE_PLUS_SEVEN)
    nccl = plan_of(*ONE_PLUS_SEVEN, "rollout.engine.weight_transfer=nccl")
    assert nccl["rank 0: generator sync bucket on the GPU"] == 256 * MIB + 2 * HEAD
    assert nccl["peak"] - base["peak"] == GIB + 256 * MIB + 2 * HEAD + 768 * MIB == 3_392_143_360


def test_a_generator_with_an_engine_of_its_own_counts_its_policy_copy(capsys):
    """rollout.mode=async with the transformers engine: rank 0's GPU holds the generator's
    bf16 copy (2 x 8.77e9 B) and the KV cache of all 8 ranks' 8 rollouts at 32,768 tokens
    (36 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 147,456 B a token: 288 GiB), so the
    plan refuses it and names generation servers first."""
    numbers = plan_of(*PAPER, "rollout.mode=async", "rollout/engine=hf")
    assert numbers["rank 0: generator policy copy"] == 2 * 8_770_000_000
    assert numbers["rank 0: generator KV cache (whole batch)"] == 64 * 32_768 * 147_456
    assert main([*PAPER, "rollout.mode=async", "rollout/engine=hf"]) == 2
    assert "fix: rollout/engine=vllm_server, " in capsys.readouterr().out
