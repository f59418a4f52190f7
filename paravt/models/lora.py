"""LoRA (and, on a CUDA GPU, QLoRA) adapters on the policy's language model, for RL on one GPU.

`apply_lora` injects peft LoRA layers in place (`peft.inject_adapter_in_model`): the model keeps
its transformers class, so the forward code, the engines and the vision-tower helpers are
unchanged; only the adapters are trainable (the vision tower and every base weight frozen).
- `BaseView(policy)`: the KL reference, the same module run with its adapters switched off
  (no second copy of the weights).
- `merged_items(policy)` / `merged_state_dict(policy)`: base + scale * B @ A under the
  base model's own parameter names (the stream the one bucketer, `paravt.models.full_weights`,
  cuts into buckets), what an engine with its own weights (vLLM, a transformers
  copy) and the merged HF export load.
- `fold_adapters(policy)`: adds the adapters into the base weights and restarts them at zero
  (B = 0), so the policy is unchanged and the reference becomes the current policy.
- `export_lora(policy, processor, path)`: the merged model at `path` (transformers / vLLM load it
  as any checkpoint) and the adapter alone at `path/adapter` (`peft.PeftModel.from_pretrained`);
  under FSDP2 gathered bucket by bucket onto rank 0's host (`full_weights.writer_state_dict`).
QLoRA (`load_in_4bit`) needs bitsandbytes' CUDA kernels: `check_qlora` refuses it elsewhere.
Under FSDP2 the adapters sit inside the sharded decoder layers like any parameter (fully_shard
keeps each parameter's requires_grad); `merged_items` gathers the shards and merges the
gathered factors, one tensor at a time as the bucketer pulls them, for the engines and the export.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from paravt.errors import UserError
from paravt.models.full_weights import full_tensor, is_writer, writer_state_dict

ADAPTER = "default"
# QLoRA keeps these in full precision. transformers' own default list (`get_keys_to_not_convert`:
# the output embeddings, i.e. `lm_head`) is replaced, not extended, by any list given, and its
# patterns match a module name from its start (or as a suffix): "visual" alone matches neither
# `model.visual.blocks.0.attn.qkv` nor `lm_head`.
QLORA_SKIP = ("model.visual", "lm_head")
INIT_SEED = 0  # the adapters' initialisation (A: kaiming-uniform draws, B: zeros)
# The language model's linear layers; the vision tower's are never matched.
LANGUAGE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSpec:
    """`model.lora`: rank 0 means no adapters (full fine-tuning, the default)."""

    rank: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = LANGUAGE_TARGETS
    load_in_4bit: bool = False  # QLoRA: a 4-bit NF4 base (CUDA + bitsandbytes only)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise UserError(f"model.lora.rank must be an int >= 0 (0: no LoRA), got {self.rank!r}")
        if self.rank and (self.alpha <= 0 or not 0 <= self.dropout < 1):
            raise UserError(
                f"model.lora needs alpha > 0 and 0 <= dropout < 1, got {self.alpha}, {self.dropout}"
            )
        if self.load_in_4bit and not self.rank:
            raise UserError("model.lora.load_in_4bit=true (QLoRA) needs model.lora.rank > 0")


def lora_spec(node: Mapping[str, Any] | LoraSpec | None) -> LoraSpec | None:
    """The `model.lora` mapping as a LoraSpec; None when absent or rank 0."""
    if node is None or isinstance(node, LoraSpec):
        spec = node
    else:
        known = {f.name for f in fields(LoraSpec)}
        unknown = sorted(set(node) - known)
        if unknown:
            raise UserError(f"model.lora: unknown key(s) {unknown}; valid keys: {sorted(known)}")
        values = dict(node)
        if "target_modules" in values:
            values["target_modules"] = tuple(values["target_modules"])
        spec = LoraSpec(**values)
    return spec if spec is not None and spec.rank > 0 else None


def check_qlora(spec: LoraSpec, sharded: bool = False) -> None:
    """QLoRA runs on one CUDA GPU with bitsandbytes; anywhere else (`sharded`: under FSDP2),
    one line saying so."""
    if not spec.load_in_4bit:
        return
    if sharded:
        raise UserError(
            "model.lora.load_in_4bit=true (QLoRA) cannot run under FSDP (trainer=fsdp): the "
            "sharded policy is cast to fp32 master weights, which transformers refuses for a "
            "bitsandbytes 4-bit model; set model.lora.load_in_4bit=false (LoRA on a bf16 base, "
            "sharded) or run QLoRA on one GPU without trainer=fsdp"
        )
    if not torch.cuda.is_available():
        raise UserError(
            "model.lora.load_in_4bit=true (QLoRA) needs a CUDA GPU: bitsandbytes' 4-bit "
            "kernels do not run on this machine; set model.lora.load_in_4bit=false (LoRA on a "
            "full-precision base) or train on a GPU"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:
        raise UserError(
            "model.lora.load_in_4bit=true (QLoRA) needs bitsandbytes: pip install 'paravt[bnb]'"
        ) from err


def quantization_kwargs(spec: LoraSpec | None, dtype: torch.dtype) -> dict[str, Any]:
    """`from_pretrained` arguments of a 4-bit NF4 base (QLoRA), or none."""
    if spec is None or not spec.load_in_4bit:
        return {}
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
        llm_int8_skip_modules=list(QLORA_SKIP),  # vision tower and lm_head in full precision
    )
    return {"quantization_config": config}


def apply_lora(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """Inject LoRA adapters into the language model's linear layers; only they train."""
    from peft import LoraConfig, inject_adapter_in_model

    pattern = r".*language_model.*\.(" + "|".join(spec.target_modules) + r")$"
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=pattern,
        bias="none",
    )
    try:
        # A fixed generator for the A factors: every process (each FSDP rank, a resume, the
        # 1-process run a sharded one is compared with) starts from the same adapters.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as err:  # peft: "Target modules ... not found in the base model"
        if "not found" not in str(err):
            raise
    if not lora_layers(model):
        raise UserError(
            f"model.lora.target_modules {list(spec.target_modules)} match no linear layer of the "
            f"language model; use names such as {list(LANGUAGE_TARGETS)}"
        )
    return model


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """name -> peft LoRA layer of every adapted module."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def is_lora(model: Any) -> bool:
    return isinstance(model, torch.nn.Module) and bool(getattr(model, "peft_config", None))


class BaseView:
    """The policy with its adapters off: the KL reference, sharing every base weight.

    Not an nn.Module on purpose: it adds no parameters, no state-dict keys, no second copy.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        self.policy = policy
        self._layers = list(lora_layers(policy).values())

    def __call__(self, *args, **kwargs):
        for layer in self._layers:
            layer._disable_adapters = True
        try:
            return self.policy(*args, **kwargs)
        finally:
            for layer in self._layers:
                layer._disable_adapters = False

    def __getattr__(self, name: str):  # config, device, dtype, parameters ... of the policy
        return getattr(self.policy, name)


@torch.no_grad()
def merged_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, merged full tensor) in the order of `model.state_dict()`, the LoRA stream of the
    one bucketer (`paravt.models.full_weights.buckets`): each tensor gathered from its FSDP2
    shard when pulled (`full_tensor`, a collective every rank runs in the same order) and each
    adapted weight merged from its gathered base weight and factors. A QLoRA base's 4-bit
    weights are dequantised first and their quantisation statistics (`<weight>.absmax`, ...)
    left out: the result has the base model's names and full-precision values."""
    layers = {n: m for n, m in lora_layers(model).items() if ADAPTER in m.lora_A}
    packed = packed_4bit_weights(model)
    statistics = tuple(f"{k}." for k in packed)
    pending: dict[str, dict[str, torch.Tensor]] = {}  # module -> its gathered base, A, B
    parts = {".base_layer.weight": "W", f".lora_A.{ADAPTER}.weight": "A"}
    parts[f".lora_B.{ADAPTER}.weight"] = "B"
    for key, value in model.state_dict().items():
        if statistics and key.startswith(statistics):
            continue
        value = dequantize_4bit(packed[key]) if key in packed else full_tensor(value)
        module, part = next(
            ((key[: -len(s)], p) for s, p in parts.items() if key.endswith(s)), (None, None)
        )
        if module not in layers:
            if ".lora_" not in key:  # another adapter's factors are not part of the model
                yield key.replace(".base_layer.", "."), value
            continue
        got = pending.setdefault(module, {})
        got[part] = value
        if len(got) == 3:
            del pending[module]
            yield f"{module}.weight", _merge(layers[module], got)
    if pending:
        raise RuntimeError(f"LoRA layers without base weight or factors: {sorted(pending)}")


def packed_4bit_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """state-dict key -> weight of every bitsandbytes 4-bit layer (a QLoRA base): packed uint8
    bytes whose `quant_state` holds the shape, dtype and statistics to dequantise them."""
    out = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if getattr(weight, "quant_state", None) is not None:
            out[f"{name}.weight" if name else "weight"] = weight
    return out


def dequantize_4bit(weight: torch.Tensor) -> torch.Tensor:
    """The full-precision [out, in] tensor a bitsandbytes 4-bit weight stands for."""
    import bitsandbytes.functional as bnbf

    return bnbf.dequantize_4bit(weight.data, weight.quant_state)


def _merge(layer, got: dict[str, torch.Tensor]) -> torch.Tensor:
    """W + scale * B @ A of one adapted linear layer ([out, in]; transposed for fan_in_fan_out)."""
    delta = (got["B"].float() @ got["A"].float()) * layer.scaling[ADAPTER]  # [out, r] @ [r, in]
    if getattr(layer, "fan_in_fan_out", False):
        delta = delta.T
    return got["W"] + delta.to(got["W"].dtype)


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter merged in (keys as without LoRA); from a
    sharded model, gathered (every rank calls it and gets the full tensors)."""
    return dict(merged_items(model))


@torch.no_grad()
def fold_adapters(model: torch.nn.Module) -> None:
    """Base weight += adapter delta, then the adapter restarts (B = 0): same policy outputs.
    One process only (the cold start that calls it refuses FSDP)."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):  # FSDP2-sharded
        raise NotImplementedError("fold_adapters on an FSDP2-sharded policy: fold on one process")
    if packed_4bit_weights(model):  # the delta cannot be added to packed 4-bit bytes
        raise NotImplementedError(
            "fold_adapters on a 4-bit (QLoRA) base: export the merged model "
            "(merged_state_dict) and load it in full precision instead"
        )
    for layer in lora_layers(model).values():
        base = layer.get_base_layer()
        base.weight += layer.get_delta_weight(ADAPTER).to(base.weight.dtype)
        layer.reset_lora_parameters(ADAPTER, init_lora_weights=True)


def export_lora(model: torch.nn.Module, processor, path: str | Path, base_path: str | None) -> None:
    """The merged model at `path`, the adapter alone (peft format) at `path/adapter`."""
    import torch.distributed as dist
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    path = Path(path)
    # sharded: every rank gathers, bucket by bucket; rank 0 keeps them on its host
    merged = writer_state_dict(merged_items(model), is_writer())
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    # peft's own layout: PeftModel wraps the model as `base_model.model`
    state = {f"base_model.model.{k}": full_tensor(v).cpu().contiguous() for k, v in state.items()}
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        dist.barrier()
        return
    model.save_pretrained(str(path), state_dict=merged)
    if processor is not None:
        processor.save_pretrained(str(path))
    adapter = path / "adapter"
    config = model.peft_config[ADAPTER]
    config.base_model_name_or_path = base_path
    config.save_pretrained(str(adapter))
    save_file(state, str(adapter / "adapter_model.safetensors"))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
