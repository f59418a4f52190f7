"""`build_engine`: the one place a rollout engine is made, for training, evaluation and the CLI.

The engine is a config choice (Hydra group `rollout/engine: hf | vllm`), never an import at the
call site: `train.py` (through the `RolloutDataModule`), `evaluate.py`, `BenchmarkValidation`
(through the DataModule's agent) and `paravt rollout` all call `build_engine`.

- `hf`: `TransformersEngine` on the policy module itself (shared weights) or on a copy of it
  (`share_weights=False`, for `rollout.max_staleness > 0`). A policy sharded by FSDP2 always gets
  an unsharded copy per rank, filled from the shards bucket by bucket: each rank then generates
  its own prompts with no collectives, however many turns its rollouts take.
- `vllm`: `VLLMEngine`, an in-process `vllm.LLM` loaded from `model_path` (or from a temporary
  export of the given model when there is no path), kept current by `sync_weights`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from paravt.rollout.engine import RolloutEngine


@dataclass(frozen=True)
class EngineConfig:
    """Which engine and its options. The vLLM fields are ignored by the transformers engine.

    GPU-only (ignored on CPU): `gpu_memory_utilization`, `tensor_parallel_size`,
    `enable_sleep_mode` (colocated training: the engine sleeps during the update and frees its
    KV cache). `kv_cache_gb` sizes the CPU backend's KV cache (VLLM_CPU_KVCACHE_SPACE).
    `mm_processor_cache_gb` caps vLLM's LRU cache of processed videos (it serves the G rollouts
    of a group and the later rounds of a trajectory, which resend the same clips); host memory
    holds up to that much per engine, so lower it when RAM is short.
    """

    name: str = "hf"
    dtype: str = "float32"
    max_model_len: int = 8192
    max_num_seqs: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False
    kv_cache_gb: int = 1
    mm_processor_cache_gb: float = 4.0  # vLLM's default
    max_videos_per_prompt: int = 16  # overview + crops of one context
    sync_bucket_mb: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise ValueError(
                f"rollout.engine.name {self.name!r} is unknown: choose one of {sorted(ENGINES)} "
                "(e.g. rollout/engine=vllm)"
            )
        if self.mm_processor_cache_gb < 0:
            raise ValueError(
                f"mm_processor_cache_gb must be >= 0, got {self.mm_processor_cache_gb}"
            )
        if self.sync_bucket_mb < 1:
            raise ValueError(f"sync_bucket_mb must be >= 1, got {self.sync_bucket_mb}")


def _hf(cfg: EngineConfig, model, processor, model_path, share_weights) -> RolloutEngine:
    from paravt.distributed import is_sharded
    from paravt.rollout.hf import TransformersEngine

    own = model if share_weights and not is_sharded(model) else engine_copy(model, cfg)
    return TransformersEngine(own, processor.tokenizer, sync_bucket_bytes=cfg.sync_bucket_mb << 20)


def engine_copy(model, cfg: EngineConfig):
    """An unsharded, frozen copy of `model` with its current weights (a deep copy, or, for an
    FSDP2-sharded model, a fresh module of the same config filled from the gathered shards)."""
    import torch

    from paravt.distributed import is_sharded, iter_full_state_dict, load_buckets
    from paravt.models.lora import is_lora, merged_state_dict

    if is_lora(model):  # the engine gets the merged weights in a plain model of the base class
        clone = type(model)._from_config(model.config, dtype=next(model.parameters()).dtype)
        clone.load_state_dict(merged_state_dict(model))
        return clone.requires_grad_(False).eval()
    if not is_sharded(model):
        return copy.deepcopy(model)

    first = next(model.parameters())
    with torch.device(first.to_local().device):
        clone = type(model)._from_config(model.config, dtype=first.dtype)
    load_buckets(clone, iter_full_state_dict(model, cfg.sync_bucket_mb << 20, first.device))
    return clone.requires_grad_(False).eval()


def _vllm(cfg: EngineConfig, model, processor, model_path, share_weights) -> RolloutEngine:
    from paravt.rollout.vllm import VLLMEngine

    return VLLMEngine.from_model(cfg, model, processor, model_path)


Builder = Callable[..., RolloutEngine]
ENGINES: dict[str, Builder] = {"hf": _hf, "vllm": _vllm}


def build_engine(
    cfg: EngineConfig | str,
    model,
    processor,
    model_path: str | None = None,
    share_weights: bool = True,
) -> RolloutEngine:
    """The configured engine for `model` (a transformers Qwen-VL module) and its processor.

    `share_weights=False` asks for an engine whose weights move only on `sync_weights` (vLLM's
    always do). `model_path` is the HF directory the model was loaded from, when it still holds
    the same weights (vLLM loads from it; otherwise the model is exported to a temporary dir).
    """
    if isinstance(cfg, str):
        cfg = EngineConfig(name=cfg)
    return ENGINES[cfg.name](cfg, model, processor, model_path, share_weights)
