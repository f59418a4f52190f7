"""Load a policy (model + processor) from a local HF-format directory.

For the CPU demo and tests the directory may be absent: `build_tiny` names an architecture and a
tiny random checkpoint is built there first (nothing is downloaded, ever), but only at the tiny
model's own folder `tiny_dir` when one is named, so a mistyped `model.path` is an error, not a
new random model (rules in `paravt.errors`). Paths are local only;
a hub id is refused with a message, since run-time downloads are not part of paravt's contract.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt.errors import check_model_path, may_build_tiny
from paravt.models.tiny import ARCHS, TinyModelConfig, build_tiny_model, tiny_config_matches

log = logging.getLogger(__name__)


# The torch dtypes a checkpoint loads in (`model.dtype`) and FSDP2 computes in.
LOAD_DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class PolicySpec:
    """Where the policy comes from and how to load it."""

    path: str
    build_tiny: str | None = None  # "qwen3_vl" | "qwen2_5_vl": build a tiny model when missing
    attn_implementation: str = "sdpa"
    dtype: str = "float32"  # how the checkpoint is loaded (FSDP keeps the policy's master fp32)
    # FSDP2 compute dtype (MixedPrecisionPolicy.param_dtype); None: bfloat16 on GPU, else float32.
    compute_dtype: str | None = None
    freeze_vision: bool = True
    gradient_checkpointing: bool = False
    tiny_dir: str | None = None  # the one folder a tiny model may be built in (None: `path`)
    tiny: Mapping[str, Any] | None = None  # TinyModelConfig sizes when build_tiny is set
    lora: Mapping[str, Any] | None = None  # paravt.models.lora.LoraSpec; rank 0: no adapters

    def __post_init__(self) -> None:
        """A dtype, tiny size or LoRA setting that cannot load fails when the config is read,
        not when the model is built."""
        from paravt.models.lora import lora_spec

        choices = ", ".join(LOAD_DTYPES)
        if self.dtype not in LOAD_DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r}: choose one of {choices}")
        if self.compute_dtype not in (None, *LOAD_DTYPES):
            raise ValueError(f"model.compute_dtype={self.compute_dtype!r}: choose one of {choices}")
        if self.build_tiny is not None:
            tiny_config(self.build_tiny, self.tiny)
        lora_spec(self.lora)


def tiny_config(arch: str, sizes: Mapping[str, Any] | None) -> TinyModelConfig:
    """`model.build_tiny` and `model.tiny` as a `TinyModelConfig` (ValueError naming the key)."""
    if arch not in ARCHS:
        raise ValueError(f"model.build_tiny must be one of {ARCHS}, got {arch!r}")
    try:
        return TinyModelConfig(arch=arch, **dict(sizes or {}))
    except TypeError as err:
        keys = list(TinyModelConfig.__annotations__)
        raise ValueError(f"model.tiny: {err}; valid keys: {keys}") from None


def ensure_tiny(path: Path, arch: str, sizes: Mapping[str, Any] | None) -> None:
    """Build the tiny checkpoint at `path` unless one built from the same config is there.

    A tiny checkpoint built from other sizes (its `paravt_tiny.json` differs) is rebuilt, so
    `model.tiny.*` overrides are never silently ignored.
    """
    cfg = tiny_config(arch, sizes)
    if tiny_config_matches(path, cfg):
        return
    if (path / "config.json").exists() and not (path / "paravt_tiny.json").exists():
        return  # a checkpoint paravt did not build here (e.g. an exported run): never overwrite
    if (path / "config.json").exists():
        log.info("tiny model in %s was built from another config: rebuilding it", path)
    build_tiny_model(path, cfg)


def policy_path(spec: PolicySpec) -> Path:
    """The checkpoint directory of `spec`, building the tiny checkpoint first when asked."""
    path = Path(spec.path).expanduser()
    if spec.build_tiny is not None and may_build_tiny(spec.path, spec.build_tiny, spec.tiny_dir):
        ensure_tiny(path, spec.build_tiny, spec.tiny)
    if not (path / "config.json").exists():
        check_model_path(spec.path, spec.build_tiny, spec.tiny_dir)
    return path


def load_policy(spec: PolicySpec, on_meta: bool = False):
    """(model, processor) for `spec`, building the tiny checkpoint first when asked.

    `on_meta`: the model's skeleton only, parameters on the meta device (no memory, no weights
    read), for FSDP2 to shard before anything is materialised (`paravt.parallel.fsdp.
    materialize_sharded` then fills the shards from rank 0's load).
    """
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from paravt.models.lora import apply_lora, check_qlora, lora_spec, quantization_kwargs

    lora = lora_spec(spec.lora)
    if lora is not None:
        check_qlora(lora, sharded=on_meta)  # before any weight is read: one CUDA GPU
    path = policy_path(spec)
    kwargs = {"dtype": getattr(torch, spec.dtype), "attn_implementation": spec.attn_implementation}
    kwargs |= quantization_kwargs(lora, kwargs["dtype"])
    if on_meta:
        with torch.device("meta"):
            config = AutoConfig.from_pretrained(path)
            model = AutoModelForImageTextToText.from_config(config, **kwargs)
    else:
        model = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
    if spec.freeze_vision:
        vision_tower(model).requires_grad_(False)
    if lora is not None:  # only the adapters train from here on
        model = apply_lora(model, lora)
    if spec.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model, AutoProcessor.from_pretrained(path)


def vision_tower(model):
    """The vision encoder of a Qwen-VL model (frozen by default, as in the paper)."""
    inner = getattr(model, "model", model)
    visual = getattr(inner, "visual", None)
    if visual is None:
        raise AttributeError(f"{type(model).__name__} has no `model.visual` vision tower")
    return visual
