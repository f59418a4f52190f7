"""`export_hf` writes the policy in the dtype it was loaded in, not FSDP's fp32 masters.

Issue 50, finding 10: a bf16 checkpoint trained under FSDP2 (masters cast to fp32 by
`fp32_master`) was exported as fp32 weights with `"dtype": "float32"` in config.json (35 GB for
8B, and `serve-rollout --dtype auto` then served fp32). Here the sharded path runs for real on a
1-rank gloo group in this process.
"""

from __future__ import annotations

import json

import torch
from safetensors import safe_open

from paravt.parallel.fsdp import export_hf, fp32_master, shard_policy


def _written_dtypes(path) -> set[torch.dtype]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)


def test_a_sharded_bf16_policy_is_exported_in_bf16(tiny_qwen3_dir, tmp_path, one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir, dtype=torch.bfloat16)
    fp32_master(model)  # what configure_sharding does before sharding
    shard_policy(model, init_device_mesh("cpu", (1,)))
    export_hf(model, None, tmp_path / "bf16", "bfloat16")  # GRPOModule passes its spec's dtype
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert _written_dtypes(tmp_path / "bf16") == {"BF16"}
    export_hf(model, None, tmp_path / "own")  # no dtype: the parameters' own (the masters)
    assert json.loads((tmp_path / "own" / "config.json").read_text())["dtype"] == "float32"
    assert _written_dtypes(tmp_path / "own") == {"F32"}
