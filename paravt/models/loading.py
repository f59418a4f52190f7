"""Load a policy (model + processor) from a local HF-format directory.

For the CPU demo and tests the directory may be absent: `build_tiny` names an architecture and a
tiny random checkpoint is built there first (nothing is downloaded, ever), but only at the tiny
model's own folder `tiny_dir` when one is named, so a mistyped `model.path` is an error, not a
new random model (rules in `paravt.errors`). Paths are local only;
a hub id is refused with a message, since run-time downloads are not part of paravt's contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from paravt.errors import UserError, check_model_path
from paravt.models.tiny import ARCHS, TinyModelConfig, build_tiny_model


@dataclass(frozen=True)
class PolicySpec:
    """Where the policy comes from and how to load it."""

    path: str
    build_tiny: str | None = None  # "qwen3_vl" | "qwen2_5_vl": build a tiny model when missing
    attn_implementation: str = "sdpa"
    dtype: str = "float32"
    freeze_vision: bool = True
    gradient_checkpointing: bool = False
    tiny_dir: str | None = None  # the one folder a tiny model may be built in (None: `path`)


def load_policy(spec: PolicySpec):
    """(model, processor) for `spec`, building the tiny checkpoint first when asked."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = Path(spec.path).expanduser()
    if not (path / "config.json").exists():
        check_model_path(spec.path, spec.build_tiny, spec.tiny_dir)
        if spec.build_tiny not in ARCHS:
            raise UserError(f"model.build_tiny must be one of {ARCHS}, got {spec.build_tiny!r}")
        build_tiny_model(path, TinyModelConfig(arch=spec.build_tiny))
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=getattr(torch, spec.dtype), attn_implementation=spec.attn_implementation
    )
    if spec.freeze_vision:
        vision_tower(model).requires_grad_(False)
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
