"""`paravt.rollout.sync.weight_sync`: the one gather (`iter_weights`) and the sync rules
(`WeightSync`), on the tiny Qwen3-VL checkpoint and a real transformers engine copy."""

from __future__ import annotations

import torch

from paravt.models.loading import PolicySpec, load_policy
from paravt.models.lora import lora_layers
from paravt.rollout import build_engine
from paravt.rollout.sync.weight_sync import WeightSync, iter_weights


def _flat(buckets) -> dict[str, torch.Tensor]:
    return {n: t for bucket in buckets for n, t in bucket}


def test_lora_weights_are_merged_under_the_base_names_unless_asked_not_to(
    lora_policy, tiny_qwen3_dir
):
    policy, _ = lora_policy
    base, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    merged = _flat(iter_weights(policy, bucket_bytes=1 << 10))
    assert list(merged) == list(base.state_dict())
    name, layer = next(iter(lora_layers(policy).items()))
    w = layer.base_layer.weight
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    scale = layer.scaling["default"]  # alpha / rank
    assert torch.allclose(merged[f"{name}.weight"], w + scale * (b @ a))
    assert not torch.equal(merged[f"{name}.weight"], w)
    own = _flat(iter_weights(policy, merge_lora=False))
    assert list(own) == list(policy.state_dict())  # factors kept, as a LoRA copy loads them


def test_floating_tensors_take_the_engine_dtype_and_integer_buffers_keep_theirs():
    module = torch.nn.Linear(3, 2)
    module.register_buffer("steps", torch.tensor([7], dtype=torch.long))
    got = _flat(iter_weights(module, dtype=torch.bfloat16, device="cpu"))
    assert got["weight"].dtype == torch.bfloat16 and got["steps"].dtype == torch.long
    assert torch.equal(got["weight"], module.weight.detach().to(torch.bfloat16))


def test_each_moment_syncs_by_its_own_rule(lora_policy):
    policy, processor = lora_policy
    engine = build_engine("hf", policy, processor, share_weights=False)  # a merged copy
    name = next(iter(lora_layers(policy)))
    engine_w = dict(engine.model.named_parameters())[f"{name}.weight"]
    with torch.no_grad():
        engine_w.zero_()  # a marker only a real sync overwrites
    sync = WeightSync(max_staleness=1)
    assert sync.at_batch(engine, policy, 1) >= 0.0 and engine.weight_version == 0  # lag 1: ok
    assert engine_w.abs().sum() == 0
    sync.at_batch(engine, policy, 2)  # lag 2 > 1: synced
    assert engine.weight_version == 2 and engine_w.abs().sum() > 0
    with torch.no_grad():
        engine_w.zero_()
    assert not WeightSync.to_version(engine, policy, 2)  # evaluation: versions agree
    assert not WeightSync.to_version(engine, None, 3)  # an engine on a fixed checkpoint
    assert engine_w.abs().sum() == 0 and engine.weight_version == 2
    WeightSync.changed(engine, policy, 2)  # cold start: new weights, same version
    merged = _flat(iter_weights(policy))[f"{name}.weight"]
    assert torch.equal(engine_w, merged)
