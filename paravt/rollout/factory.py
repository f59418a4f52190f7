"""`build_engine`: the one place a rollout engine is made, for training, evaluation and the CLI.

The engine is a config choice (Hydra group `rollout/engine: hf | vllm`), never an import at the
call site: `train.py` (through the `RolloutDataModule`), `evaluate.py`, `BenchmarkValidation`
(through the DataModule's agent) and `paravt rollout` all call `build_engine`.

- `hf`: `TransformersEngine` on the policy module itself (shared weights) or on a copy of it
  (`share_weights=False`, for `rollout.max_staleness > 0`). A policy sharded by FSDP2 always gets
  an unsharded copy per rank, filled from the shards bucket by bucket: each rank then generates
  its own prompts with no collectives, however many turns its rollouts take. A copy is built at
  `rollout.engine.dtype` (`engine_dtype`; auto: the model's load dtype, not FSDP2's fp32 master
  weights), and never from a meta-device skeleton (it would hold no weights).
- `vllm`: `VLLMEngine`, an in-process `vllm.LLM` loaded from `model_path` (or from a temporary
  export of the given model when there is no path), kept current by `sync_weights`.
- `vllm_server`: `ServerEngine`, the same vLLM engine in rollout server processes
  (`paravt serve-rollout`) reached over HTTP: the servers of `server_urls`, or `num_servers`
  started here on `model_path` (or an export) with `server_python`; no vLLM import in this
  process.

When an engine is synced is `paravt.rollout.sync.weight_sync.WeightSync`'s business, and how its
weights are gathered `iter_weights`'s.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

from paravt.rollout.engine import EngineConfig, RolloutEngine


def _hf(cfg: EngineConfig, model, processor, model_path, share_weights) -> RolloutEngine:
    from paravt.parallel.distributed import is_sharded
    from paravt.rollout.engines.hf import TransformersEngine

    own = model if share_weights and not is_sharded(model) else engine_copy(model, cfg)
    return TransformersEngine(own, processor.tokenizer, sync_bucket_bytes=cfg.sync_bucket_mb << 20)


def engine_dtype(cfg: EngineConfig, model):
    """The dtype the engine generates in: `cfg.dtype`, or for "auto" the dtype the model was
    loaded at (`model.config.dtype`, i.e. `model.dtype` of the config). FSDP2 keeps the policy's
    master weights in fp32 (`paravt.parallel.fsdp.fp32_master`) but leaves its config alone, so
    a bf16 checkpoint still gets a bf16 engine, as FSDP2's bf16 compute does."""
    import torch

    if cfg.dtype != "auto":
        return getattr(torch, cfg.dtype)
    configured = getattr(getattr(model, "config", None), "dtype", None)
    if isinstance(configured, str):
        configured = getattr(torch, configured)
    return configured if isinstance(configured, torch.dtype) else _first_param(model).dtype


def _first_param(model):
    from paravt.parallel.distributed import is_sharded

    first = next(model.parameters())
    return first.to_local() if is_sharded(model) else first


def engine_copy(model, cfg: EngineConfig):
    """An unsharded, frozen copy of `model` with its current weights at the engine's dtype
    (`engine_dtype`): a deep copy when nothing changes, otherwise a fresh module of the same
    config (rotary tables as transformers builds them) filled bucket by bucket from the full
    weights (`paravt.rollout.sync.weight_sync.iter_weights`: gathered from the shards of an FSDP2
    model, merged for a LoRA one)."""
    import torch

    from paravt.models.lora import is_lora
    from paravt.parallel.distributed import is_sharded, load_buckets, on_meta
    from paravt.rollout.sync.weight_sync import iter_weights

    if on_meta(model):
        raise RuntimeError(
            "the rollout engine's copy of the policy was requested while the policy is still a "
            "meta-device skeleton (FSDP2 fills it in configure_model): it would hold no weights; "
            "build the engine after the model is materialised"
        )
    dtype, first = engine_dtype(cfg, model), _first_param(model)
    if not is_sharded(model) and not is_lora(model) and first.dtype == dtype:
        return copy.deepcopy(model)
    # LoRA: the adapters are injected in place, so the class is the base model's.
    with torch.device(first.device):
        clone = type(model)._from_config(model.config, dtype=dtype)
    load_buckets(clone, iter_weights(model, cfg.sync_bucket_mb << 20, first.device))
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
    from paravt.rollout.engines.vllm import VLLMEngine

    check_context(cfg.max_model_len, getattr(model, "config", None))
    if cfg.dtype == "auto":  # vLLM's own "auto" would serve an fp32 checkpoint in 16 bits
        cfg = replace(cfg, dtype=str(engine_dtype(cfg, model)).removeprefix("torch."))
    return VLLMEngine.from_model(cfg, model, processor, model_path)


def _vllm_server(cfg: EngineConfig, model, processor, model_path, share_weights) -> RolloutEngine:
    from paravt.models.lora import is_lora
    from paravt.parallel.collectives import on_rank0
    from paravt.rollout.serving.checkpoint import model_manifest
    from paravt.rollout.serving.client import ServerEngine
    from paravt.rollout.serving.nccl import check_cuda

    check_cuda(cfg.weight_transfer)  # nccl without CUDA: refused before any server starts
    if cfg.dtype == "auto":
        cfg = replace(cfg, dtype=str(engine_dtype(cfg, model)).removeprefix("torch."))
    # what every synced checkpoint must hold (LoRA: merged names, known at the first sync)
    manifest = None if is_lora(model) else model_manifest(model)
    if cfg.server_urls:
        return ServerEngine(cfg.server_urls, cfg, manifest=manifest)
    check_one_launch()
    check_one_host()
    check_context(cfg.max_model_len, getattr(model, "config", None))
    # Rank 0 starts the servers, once for every rank; the URLs (or its error) reach every rank
    # through the process group, however the launcher numbered the processes.
    started: list = []
    urls = on_rank0(lambda: _start_servers(cfg, model, processor, model_path, started))
    return ServerEngine(urls, cfg, started, manifest, started=True)


def _start_servers(cfg: EngineConfig, model, processor, model_path, out: list) -> list[str]:
    """Start `cfg.num_servers` servers (appended to `out`); their URLs. A failed start stops
    the ones already up."""
    from paravt.rollout.serving.launch import server_python, start_server

    python = server_python(cfg.server_python)
    path = model_path or export_model(model, processor)
    log_dir = cfg.server_log_dir or None
    try:
        for i in range(cfg.num_servers):
            devices = cfg.server_gpus(i)
            timeout = cfg.server_start_timeout_s
            out.append(start_server(path, cfg, python, log_dir, timeout, devices))
    except BaseException:
        for server in out:
            server.stop()
        raise
    return [s.url for s in out]


def check_one_host() -> None:
    """Servers paravt starts listen on rank 0's loopback: every rank must be on its machine."""
    import socket

    from paravt.errors import UserError
    from paravt.parallel.collectives import all_gather_object
    from paravt.parallel.distributed import Rank

    if Rank.current().world_size == 1:
        return
    hosts = all_gather_object(socket.gethostname())
    if len(set(hosts)) > 1:
        raise UserError(
            f"rollout/engine=vllm_server would start its servers on rank 0's machine "
            f"({hosts[0]}), where the ranks on {sorted(set(hosts) - {hosts[0]})} cannot reach "
            "them: start the servers apart (`paravt serve-rollout --host 0.0.0.0`) and give "
            "them in rollout.engine.server_urls (docs/training.md, more nodes)"
        )


def check_one_launch() -> None:
    """Servers are started by rank 0 of the live process group: a process that a multi-process
    launch started (WORLD_SIZE > 1) before its group exists cannot know whether it is the one."""
    import os

    from paravt.errors import UserError
    from paravt.parallel.distributed import Rank

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1 and Rank.current().world_size == 1:
        raise UserError(
            f"rollout/engine=vllm_server would start servers in a process of a {world}-process "
            "launch whose process group is not initialised, so every process would start its "
            "own: build the engine after the group is up (train.py does), or give running "
            "servers in rollout.engine.server_urls"
        )


def export_model(model, processor) -> str:
    """`model` (LoRA: merged) and its processor into a temporary HF folder an engine loads."""
    import tempfile

    from paravt.models.lora import is_lora, merged_state_dict

    path = tempfile.mkdtemp(prefix="paravt_engine_")
    merged = merged_state_dict(model) if is_lora(model) else None  # LoRA: base names
    model.save_pretrained(path, state_dict=merged)
    processor.save_pretrained(path)
    return path


Builder = Callable[..., RolloutEngine]
ENGINES: dict[str, Builder] = {"hf": _hf, "vllm": _vllm, "vllm_server": _vllm_server}


def loads_from_path(name: str, model_path: str | None) -> bool:
    """Whether engine `name` reads its weights from `model_path` itself (vLLM and its servers
    do): the caller's model then needs no weights, only its config (a skeleton will do)."""
    return name in ("vllm", "vllm_server") and model_path is not None


def holds_own_weights(name: str) -> bool:
    """Whether engine `name` keeps its weights out of the caller's process (rollout servers):
    the policy it is given is read only when it syncs, so the caller needs no copy on a device
    (the async generator then reads the shared host copy, `SharedWeights.attach`)."""
    return name == "vllm_server"


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
