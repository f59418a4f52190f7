"""LoRA RL under FSDP2: GRPOModule with rank-4 adapters on 2 CPU ranks over gloo
equals 1 rank.

The same fixed rollout batches (real rollouts of the tiny model, sampled once here; the third
step has 3 prompts, dealt 2 + 1) are trained on 1 process and on 2 (a meta-device skeleton that
rank 0 fills, as `train.py trainer=fsdp` builds it), KL on (the reference is the policy with its
adapters off, sharded with it). Asserted: the adapters and the losses of both runs agree, only
adapter tensors moved, the engines (a transformers copy, a synced base model) hold base +
scale * B @ A gathered from the shards and give the sharded policy's log-probs, and the
checkpoint holds the adapters.
"""

from __future__ import annotations

import pytest
import torch

from paravt.models.loading import PolicySpec, load_policy

from . import worker
from .launch import one_and_two_ranks
from .lora_worker import LORA

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tiny_qwen3_dir, needle_samples, tmp_path_factory):
    """(1-rank results, 2-rank results per rank) of LoRA GRPOModule on the same batches."""
    root = tmp_path_factory.mktemp("grpo_fsdp_lora")
    batches = worker.rollout_batches(str(tiny_qwen3_dir), needle_samples, steps=2, group=4)
    batches.append(worker.first_prompts(batches[0], step=2, prompts=3))
    torch.save(batches, root / "batches.pt")
    one, two = one_and_two_ranks(["lora", str(tiny_qwen3_dir)], root, str(root / "batches.pt"))
    return one, two, root


def _split(weights: dict) -> tuple[dict, dict]:
    """(adapter tensors, base tensors) of a LoRA model's state dict."""
    lora = {k: v for k, v in weights.items() if ".lora_" in k}
    return lora, {k: v for k, v in weights.items() if ".lora_" not in k}


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_ranks_train_the_adapters_like_one_rank(runs, tiny_qwen3_dir):
    one, two, _ = runs
    initial, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir), lora=LORA))
    start_lora, start_base = _split(dict(initial.state_dict()))
    lora, base = _split(one["weights"])
    assert _max_diff(lora, start_lora) > 1e-4  # the 3 updates moved the adapters
    assert max(float(v.abs().max()) for k, v in lora.items() if ".lora_B." in k) > 1e-4
    assert _max_diff(base, start_base) == 0.0  # ... and nothing else
    for rank in two:
        assert rank["sharded"] and not one["sharded"]
        r_lora, r_base = _split(rank["weights"])
        assert _max_diff(r_lora, lora) < 1e-5
        assert _max_diff(r_base, start_base) == 0.0
        assert rank["trainable"] == one["trainable"]
        assert rank["trainable"] and all(".lora_" in n for n in rank["trainable"])


def test_losses_and_metrics_match(runs):
    one, two, _ = runs
    # grad_norm is the norm of the global loss's gradient; the logged losses are weighed by
    # each rank's trained tokens: both equal one process's.
    keys = ("reward/mean", "grad_norm", "kl/reference", "update/trajectories", "loss/loss")
    keys += ("loss/anchor", "loss/logprob_gap", "update/trained_tokens")
    assert len(one["metrics"]) == 3
    assert [m["update/trajectories"] for m in one["metrics"]] == [16.0, 16.0, 12.0]
    # The batches were sampled once by the base model, which is also the reference (adapters
    # off): the reward-side k1 of sampler vs reference is 0 up to float rounding, of either sign
    # by CPU model. That the adapters moved off the base shows in the policy's distance from the
    # sampler instead, a mean |logp - behaviour| that cannot go negative: float noise (~1e-7) at
    # step 0, lr-sized (~1e-3) once the adapters trained.
    assert all(abs(m["kl/reference"]) < 1e-5 for m in one["metrics"])
    gaps = [m["loss/logprob_gap"] for m in one["metrics"]]
    assert gaps[0] < 1e-5 and min(gaps[1:]) > 1e-4, gaps
    for rank in two:
        for k in keys:
            got = [m[k] for m in rank["metrics"]]
            want = [m[k] for m in one["metrics"]]
            assert got == pytest.approx(want, rel=1e-4, abs=1e-6), k


def _merged(weights: dict) -> dict:
    """W + alpha / rank * B @ A under the base model's names, computed here by hand."""
    scale = LORA["alpha"] / LORA["rank"]
    out = {}
    for key, value in weights.items():
        if ".lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        stem = key.removesuffix(".base_layer.weight")
        if stem != key:
            b, a = (
                weights[f"{stem}.lora_B.default.weight"],
                weights[f"{stem}.lora_A.default.weight"],
            )
            value = value + scale * b @ a
        out[name] = value
    return out


def test_engines_hold_the_merged_policy(runs):
    one, two, _ = runs
    for res in (one, *two):
        want = _merged(res["weights"])
        plain = {k.replace(".base_layer.", "."): v for k, v in _split(res["weights"])[1].items()}
        assert _max_diff(want, plain) > 1e-5  # the adapters are in the merged weights
        for engine in ("engine_copy", "engine_synced"):
            assert _max_diff(res[engine], want) < 1e-5, engine
        assert res["engine_version"] == 7
        for engine in ("copy", "synced"):
            diff = (res["logp"][engine] - res["logp"]["policy"]).abs().max()
            assert float(diff) < 1e-4, engine


def test_checkpoints_hold_the_adapters(runs):
    one, two, _ = runs
    for keys in (one["checkpoint_keys"], two[0]["checkpoint_keys"]):
        model = [k for k in keys if k.startswith("state_dict.")]
        lora = [k for k in model if ".lora_A." in k or ".lora_B." in k]
        assert len(lora) == 2 * 2 * 7  # 2 layers x 7 projections x (A, B)
        assert any(k.endswith(".q_proj.base_layer.weight") for k in model)
        assert not any(k.startswith("state_dict.reference.") for k in keys)
    # The sharded (DCP) checkpoint names its optimizer state: AdamW moments of adapters only.
    moments = [k for k in two[0]["checkpoint_keys"] if k.startswith("optimizer_0.state.")]
    assert moments and all(".lora_" in k for k in moments)
    assert two[0]["checkpoint_keys"] == two[1]["checkpoint_keys"]


def test_exports_hold_the_merged_model_and_the_adapter(runs):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    one, _, root = runs
    want = _merged(one["weights"])
    lora = _split(one["weights"])[0]
    for run in ("one", "two"):  # two: gathered from the shards, written by rank 0
        hf = root / run / "hf"
        merged = AutoModelForImageTextToText.from_pretrained(hf, dtype=torch.float32)
        assert _max_diff(dict(merged.state_dict()), want) < 1e-5, run
        adapter = load_file(hf / "adapter" / "adapter_model.safetensors")
        assert len(adapter) == len(lora) == 2 * 2 * 7
        for key, value in adapter.items():  # peft's names: no adapter name in the key
            mine = key.removeprefix("base_model.model.").replace(".weight", ".default.weight")
            assert torch.allclose(value, lora[mine], atol=1e-5), key
