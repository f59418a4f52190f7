"""The one bucketer (`paravt.models.full_weights.buckets`) serves the weight sync and both
exports, with the LoRA merge and the FSDP2 gather as the streams it is fed.

Issue 51, point 2: `iter_weights` dispatched to two near-copy bucketers (lora.py, distributed.py)
and `export_hf` gathered a third way. Here the sharded path runs for real on a 1-rank gloo group
in this process, and every output is checked against tensors taken before sharding: the merged
weights against W + scale * B @ A computed by hand from the unsharded factors.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from paravt.models.full_weights import buckets
from paravt.models.lora import export_lora, lora_layers
from paravt.parallel.fsdp import export_hf, shard_policy
from paravt.rollout.sync.weight_sync import iter_weights

BUCKET = 64 << 10


def _items(*sizes_and_dtypes):
    return [(f"t{i}", torch.ones(n, dtype=d)) for i, (n, d) in enumerate(sizes_and_dtypes)]


def test_a_bucket_closes_at_the_bound_counted_before_the_cast():
    f32, i64 = torch.float32, torch.int64
    items = _items((10, f32), (5, f32), (30, f32), (2, i64))  # 40, 20, 120, 16 bytes
    got = list(buckets(items, bucket_bytes=60, dtype=torch.bfloat16))
    # 40 < 60, 40 + 20 = 60 closes; 120 alone closes; 16 is the rest. Counted after the cast
    # (bf16: 20 + 10 + 60 = 90) the first three would share one bucket.
    assert [[n for n, _ in b] for b in got] == [["t0", "t1"], ["t2"], ["t3"]]
    dtypes = [t.dtype for b in got for _, t in b]
    assert dtypes == [torch.bfloat16] * 3 + [torch.int64]  # integer buffers keep theirs
    with pytest.raises(ValueError, match="bucket_bytes must be > 0, got 0"):
        next(buckets(items, bucket_bytes=0))


def _by_hand(policy) -> dict[str, torch.Tensor]:
    """The merged state dict from the unsharded tensors: W + scale * B @ A per adapted layer
    (scale = alpha / rank = 32 / 4 = 8), every other tensor under its base name as it is."""
    out = {}
    for key, value in policy.state_dict().items():
        if ".lora_" not in key:
            out[key.replace(".base_layer.", ".")] = value.detach().clone()
    for name, layer in lora_layers(policy).items():
        w = layer.base_layer.weight.detach()
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        assert layer.scaling["default"] == 8.0
        out[f"{name}.weight"] = w + 8.0 * (b.detach() @ a.detach())
    return out


def _layout(bucket_list) -> list[list[tuple[str, torch.dtype, tuple]]]:
    return [[(n, t.dtype, tuple(t.shape)) for n, t in b] for b in bucket_list]


def test_the_lora_merge_gathered_from_fsdp2_shards_matches_the_hand_merge(
    lora_policy, tiny_qwen3_dir, tmp_path, one_rank_group
):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    policy, processor = lora_policy  # this module's own instance: sharded in place below
    want = _by_hand(policy)
    plain = list(iter_weights(policy, BUCKET))  # unsharded: the same bucketer, no gather
    shard_policy(policy, init_device_mesh("cpu", (1,)))
    assert all(isinstance(p, DTensor) for p in policy.parameters())
    sharded = list(iter_weights(policy, BUCKET, "cpu"))
    assert _layout(sharded) == _layout(plain)  # same names, dtypes and bucket boundaries
    sizes = [sum(t.numel() * t.element_size() for _, t in b) for b in sharded]
    assert len(sizes) > 3 and all(s >= BUCKET for s in sizes[:-1])
    got = {n: t for b in sharded for n, t in b}
    assert list(got) == list(want)
    for name, t in got.items():
        torch.testing.assert_close(t, want[name], rtol=0, atol=1e-6, msg=name)
    adapted = {f"{n}.weight": m.base_layer.weight for n, m in lora_layers(policy).items()}
    assert adapted and all(not torch.allclose(got[n], w.full_tensor()) for n, w in adapted.items())
    export_lora(policy, processor, tmp_path / "hf", str(tiny_qwen3_dir))  # the export: same
    written = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(written) <= set(got) and set(adapted) <= set(written)
    assert all(torch.equal(written[n], got[n]) for n in written)


def test_the_plain_export_and_sync_of_a_sharded_policy_are_the_unsharded_weights(
    tiny_qwen3_dir, tmp_path, one_rank_group
):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    shard_policy(model, init_device_mesh("cpu", (1,)))
    synced = {n: t for b in iter_weights(model, BUCKET, "cpu", torch.bfloat16) for n, t in b}
    assert list(synced) == list(want)
    assert all(torch.equal(synced[k], v.to(torch.bfloat16)) for k, v in want.items())
    export_hf(model, None, tmp_path / "bf16", "bfloat16")
    written = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert set(written) <= set(want) and "model.language_model.norm.weight" in written
    assert all(torch.equal(t, want[k].to(torch.bfloat16)) for k, t in written.items())
