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

from paravt.rollout.engine import EngineConfig, RolloutEngine


def _hf(cfg: EngineConfig, model, processor, model_path, share_weights) -> RolloutEngine:
    from paravt.parallel.distributed import is_sharded
    from paravt.rollout.hf import TransformersEngine

    own = model if share_weights and not is_sharded(model) else engine_copy(model, cfg)
    return TransformersEngine(own, processor.tokenizer, sync_bucket_bytes=cfg.sync_bucket_mb << 20)


def engine_copy(model, cfg: EngineConfig):
    """An unsharded, frozen copy of `model` with its current weights (a deep copy, or, for an
    FSDP2-sharded model, a fresh module of the same config filled from the gathered shards)."""
    import torch

    from paravt.models.lora import is_lora, iter_merged_state_dict
    from paravt.parallel.distributed import is_sharded, iter_full_state_dict, load_buckets

    if not is_sharded(model) and not is_lora(model):
        return copy.deepcopy(model)
    # LoRA: the merged weights in a plain model of the base class (gathered when sharded)
    first = next(model.parameters())
    device = first.to_local().device if is_sharded(model) else first.device
    with torch.device(device):
        clone = type(model)._from_config(model.config, dtype=first.dtype)
    gather = iter_merged_state_dict if is_lora(model) else iter_full_state_dict
    load_buckets(clone, gather(model, cfg.sync_bucket_mb << 20, device))
    return clone.requires_grad_(False).eval()


def check_context(max_model_len: int, model_config) -> None:
    """vLLM refuses a `max_model_len` above the checkpoint's position range, a minute into its
    start-up and in its own words; say it first, with the paravt key that sets it. The key
    follows `rollout.agent.max_total_tokens` (65,536 in evaluation, 4,096 in the demo), so a
    checkpoint with a shorter context (the tiny model: 8,192) needs that lowered."""
    text = getattr(model_config, "text_config", None) or model_config
    limit = getattr(text, "max_position_embeddings", None)
    if limit is not None and max_model_len > int(limit):
        raise ValueError(
            f"rollout.engine.max_model_len={max_model_len} is above the model's context of "
            f"{int(limit)} tokens (max_position_embeddings in its config.json), which vLLM "
            f"refuses: set rollout.agent.max_total_tokens={int(limit)} or lower (the engine's "
            "max_model_len follows it unless rollout.engine.max_model_len is set)"
        )


def _vllm(cfg: EngineConfig, model, processor, model_path, share_weights) -> RolloutEngine:
    from paravt.rollout.vllm import VLLMEngine

    check_context(cfg.max_model_len, getattr(model, "config", None))
    return VLLMEngine.from_model(cfg, model, processor, model_path)


Builder = Callable[..., RolloutEngine]
ENGINES: dict[str, Builder] = {"hf": _hf, "vllm": _vllm}


def check_engine_name(name: str) -> None:
    """A clear error for an engine name the factory does not know."""
    if name not in ENGINES:
        raise ValueError(
            f"rollout.engine.name {name!r} is unknown: choose one of {sorted(ENGINES)} "
            "(e.g. rollout/engine=vllm)"
        )


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
    check_engine_name(cfg.name)
    return ENGINES[cfg.name](cfg, model, processor, model_path, share_weights)
