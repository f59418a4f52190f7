"""The memory plan's wiring for `paravt check-recipe`: a composed config ->
`paravt.run.memory_plan`'s inputs, and the per-GPU reports of the trainer and of a
rollout server."""

from __future__ import annotations

import math

from omegaconf import DictConfig

from paravt.run.recipe_problems import (
    DEVICES,
    SERVER_ENGINE,
    Problem,
    _sharded,
    compose,
    world_size,
)


def plan_inputs(cfg: DictConfig, gpu_gb: float):
    from paravt.run.memory_plan import PlanInputs

    world, engine = world_size(cfg), cfg.rollout.engine
    return PlanInputs(
        world=world,
        prompts_per_rank=math.ceil(int(cfg.data.batch_size) / world),
        group_size=int(cfg.rollout.group_size),
        max_total_tokens=int(cfg.rollout.agent.max_total_tokens),
        micro_batch_tokens=int(cfg.algorithm.get("micro_batch_tokens", 16384)),
        kl=float(cfg.algorithm.get("kl_coef", 0.0)) > 0,
        freeze_vision=bool(cfg.model.get("freeze_vision", True)),
        adam_bytes=2 if "8bit" in str(cfg.optimizer.get("_target_", "")) else 8,
        engine=str(engine.get("name", "hf")),
        vllm_share=float(engine.get("gpu_memory_utilization", 0.5) or 0.5),
        sleep_mode=bool(engine.get("enable_sleep_mode", False)),
        checkpointing=bool(cfg.model.get("gradient_checkpointing", False)),
        gpu_gb=gpu_gb,
        engine_dtype=plan_engine_dtype(cfg),
        feature_cache_bytes=feature_cache_bytes(cfg),
        generator=generator_role(cfg),
        sync_bucket_bytes=int(engine.get("sync_bucket_mb", 256)) << 20,
    )


def generator_role(cfg: DictConfig) -> str:
    """What rank 0's async generator puts on its GPU (`paravt.run.memory_plan.generator_items`):
    none in sync mode; on rollout servers nothing ("host", checkpoint sync) or a sync bucket
    ("nccl"); otherwise a policy copy its engine generates with ("copy")."""
    if cfg.rollout.get("mode", "sync") != "async":
        return ""
    engine = cfg.rollout.engine
    if engine.get("name") != SERVER_ENGINE:
        return "copy"
    return "nccl" if engine.get("weight_transfer", "checkpoint") == "nccl" else "host"


def feature_cache_bytes(cfg: DictConfig) -> int:
    """One model's vision feature cache bound (`rollout.vision_cache.feature_bytes`), 0 when
    the cache is off."""
    cache = cfg.rollout.get("vision_cache") or {}
    return int(cache.get("feature_bytes", 0)) if cache.get("enabled", False) else 0


def plan_engine_dtype(cfg: DictConfig) -> str:
    """`rollout.engine.dtype`, "auto" read as the model's load dtype (`model.dtype`), as
    `paravt.rollout.factory.engine_dtype` does."""
    from paravt.run.memory_plan import DTYPES

    name = str(cfg.rollout.engine.get("dtype", "auto"))
    name = str(cfg.model.get("dtype", "float32")) if name == "auto" else name
    if name not in DTYPES:
        raise ValueError(f"rollout.engine.dtype={name!r}: choose one of {sorted(DTYPES)} or auto")
    return name


def memory_report(
    cfg: DictConfig, gpu_gb: float, overrides: list[str] = ()
) -> tuple[str, list[Problem]]:
    """The printed plan and, on a GPU trainer, a problem when its peak exceeds the GPU.

    A `model.path` that names no published model and holds no config.json yet (e.g. the SFT
    export a run will write) is sized as the model group's own checkpoint."""
    from paravt.run.memory_plan import GIB, format_plan, model_size, plan

    size = model_size(cfg.model)
    if size is None and any(o.startswith("model.path=") for o in overrides):
        group = compose([o for o in overrides if not o.startswith("model.path=")])
        size = model_size(group.model)
    if size is None:
        return f"memory plan: sizes of {cfg.model.path} unknown (no config.json there)", []
    x = plan_inputs(cfg, gpu_gb)
    numbers = plan(size, x)
    text = format_plan(size, x, numbers)
    if cfg.trainer.get("accelerator") != "gpu" or numbers["peak"] <= numbers["gpu"]:
        return text, []
    # bitsandbytes' 8-bit AdamW is no fix under FSDP (`_library_problems`)
    eight_bit = "" if _sharded(cfg) else "optimizer=adamw8bit, "
    sleep = "" if x.engine != "vllm" or x.sleep_mode else "rollout.engine.enable_sleep_mode=true, "
    # a generator generating on rank 0's GPU needs a policy copy there; on servers it needs none
    servers = "rollout/engine=vllm_server, " if x.generator == "copy" else ""
    fix = (
        f"{servers}{sleep}model.gradient_checkpointing=true, a lower "
        "algorithm.micro_batch_tokens or rollout.agent.max_total_tokens, "
        f"{eight_bit}or more ranks (trainer.devices)"
    )
    need = f"{numbers['peak'] / GIB:.1f} GiB per GPU"
    return text, [Problem(f"the memory plan needs {need}, more than a {gpu_gb:g} GB GPU", fix)]


def server_report(cfg: DictConfig, gpu_gb: float) -> tuple[str, list[Problem]]:
    """The plan of one generation-server GPU (`rollout/engine=vllm_server`), and the problems
    that stop vLLM at start-up: weights above its memory share, or no room in the rest for
    the KV cache of one `max_model_len` sequence."""
    from paravt.run.memory_plan import (
        GIB,
        SERVER_KV,
        ServerInputs,
        format_server_plan,
        model_size,
        server_plan,
    )

    engine, size = cfg.rollout.engine, model_size(cfg.model)
    if engine.get("name") != SERVER_ENGINE or size is None:
        return "", []
    x = ServerInputs(
        tensor_parallel=int(engine.get("tensor_parallel_size", 1) or 1),
        gpu_share=float(engine.get("gpu_memory_utilization", 0.9) or 0.9),
        max_num_seqs=int(engine.get("max_num_seqs", 64)),
        max_model_len=int(engine.max_model_len),
        gpu_gb=gpu_gb,
        dtype=plan_engine_dtype(cfg),
    )
    numbers = server_plan(size, x)
    one = numbers["KV cache of one trajectory at max_model_len"]
    if numbers[SERVER_KV] >= one:
        return format_server_plan(size, x, numbers), []
    what = (
        f"a generation server's KV reservation ({numbers[SERVER_KV] / GIB:.1f} GiB) holds no "
        f"{x.max_model_len}-token sequence ({one / GIB:.1f} GiB): vLLM refuses to start"
    )
    fix = (
        "a higher rollout.engine.gpu_memory_utilization, rollout.engine.tensor_parallel_size=2 "
        f"with twice the rollout.engine.{DEVICES}, or a lower rollout.engine.max_model_len"
    )
    return format_server_plan(size, x, numbers), [Problem(what, fix)]
