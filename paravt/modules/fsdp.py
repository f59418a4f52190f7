"""Lightning's FSDP strategy for Qwen-VL policies, built from layer class names (Hydra-friendly).

Not exercised on CPU: FSDP needs a process group on GPUs. The reference model is a plain module
attribute of the LightningModule, so FSDP shards it with the same wrapping policy.
"""

from __future__ import annotations

from collections.abc import Sequence


def decoder_layer_classes(names: Sequence[str]) -> set[type]:
    """Resolve transformers layer class names to classes, skipping those not installed."""
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as q25
    import transformers.models.qwen3_vl.modeling_qwen3_vl as q3

    found = {getattr(m, n) for n in names for m in (q3, q25) if hasattr(m, n)}
    if not found:
        raise ValueError(f"none of the layer classes {list(names)} exist in transformers")
    return found


def fsdp_strategy(layer_classes: Sequence[str], sharding_strategy: str = "FULL_SHARD", **kwargs):
    from lightning.pytorch.strategies import FSDPStrategy

    return FSDPStrategy(
        auto_wrap_policy=decoder_layer_classes(layer_classes),
        activation_checkpointing_policy=decoder_layer_classes(layer_classes),
        sharding_strategy=sharding_strategy,
        **kwargs,
    )
