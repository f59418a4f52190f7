"""vLLM inside a multi-GPU trainer launch: one engine per rank, on the rank's own GPU, in-process.

Under Lightning / torchrun / srun every rank builds its own `vllm.LLM` (colocated with the FSDP
trainer, as TRL's `vllm_mode="colocate"` and verl's hybrid engine do). Four rules follow:
- placement: vLLM's default single-process executor puts every engine on `cuda:0`; with
  `distributed_executor_backend="external_launcher"` it reads RANK / LOCAL_RANK from the
  environment and places the engine on `cuda:LOCAL_RANK`. Lightning's own launcher sets
  LOCAL_RANK but not RANK, srun sets neither (only SLURM_*), so `export_launch_env` writes both
  from the live process group and the trainer's CUDA device before the engine starts;
- independence: each engine is a replica of its own (vLLM's `data_parallel_size` stays 1).
  With `data_parallel_size=W` vLLM makes every engine step an all-reduce over the W ranks ("are
  any requests left?"), so ranks that call `generate` a different number of times (agent rounds
  differ; a rank with no prompts) would wait for each other for ever. vLLM still builds its
  size-1 groups inside the trainer's process group: a collective once, at start-up, when every
  rank builds its engine;
- process: the engine core must run in the trainer's process (VLLM_ENABLE_V1_MULTIPROCESSING=0):
  the in-place reload streams weights gathered from the FSDP shards, which cannot cross into a
  child process;
- tensor parallelism: a per-rank engine with `tensor_parallel_size > 1` would need a TP group
  of ranks holding identical prompts; paravt refuses it at start-up and names the alternative.
"""

from __future__ import annotations

import os
from typing import Any

from paravt.errors import UserError


def launch_world() -> tuple[int, int]:
    """(rank, world size) of the launch this process belongs to (1 process: (0, 1))."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def check_tensor_parallel(tensor_parallel_size: int, world: int) -> None:
    """Refuse a per-rank engine with tensor parallelism under a data-parallel launch."""
    if tensor_parallel_size > 1 and world > 1:
        raise UserError(
            f"rollout.engine.tensor_parallel_size={tensor_parallel_size} under a {world}-rank "
            "data-parallel launch: each rank builds its own vLLM engine, which cannot form a "
            "tensor-parallel group across the trainer's ranks; set "
            "rollout.engine.tensor_parallel_size=1 (every rank's engine holds the whole model "
            "in bf16 while FSDP shards the trainer) or use rollout/engine=hf"
        )


def gpu_launch_kwargs(tensor_parallel_size: int, world: int) -> dict[str, Any]:
    """The `vllm.LLM` arguments that place a rank's engine under a W-rank GPU launch."""
    check_tensor_parallel(tensor_parallel_size, world)
    if world <= 1:
        return {}
    # data_parallel_size stays 1: independent replicas, no per-step all-reduce over the ranks
    return {"distributed_executor_backend": "external_launcher"}


# Variables from which vLLM would size a data-parallel group of its own (offline SPMD mode).
VLLM_DP_ENV = (
    "VLLM_DP_SIZE",
    "VLLM_DP_RANK",
    "VLLM_DP_RANK_LOCAL",
    "VLLM_DP_MASTER_IP",
    "VLLM_DP_MASTER_PORT",
)


def launch_env(rank: int, world: int, device_index: int) -> dict[str, str]:
    """What vLLM's external launcher reads from the environment for this rank: RANK, and as
    LOCAL_RANK the index of the CUDA device the engine goes on (the trainer's own)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of size {world}")
    return {"RANK": str(rank), "LOCAL_RANK": str(device_index), "WORLD_SIZE": str(world)}


def trainer_device_index() -> int:
    """The CUDA device this rank trains on (Lightning, torchrun and srun launches alike set it
    per rank before the engine is built); 0 without CUDA."""
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def export_launch_env(device_index: int | None = None) -> dict[str, str]:
    """Write `launch_env` for this rank (from the live process group, not from what the launcher
    happened to export) and drop vLLM's data-parallel variables; returns what was written."""
    rank, world = launch_world()
    env = launch_env(rank, world, trainer_device_index() if device_index is None else device_index)
    os.environ.update(env)
    for key in VLLM_DP_ENV:
        os.environ.pop(key, None)
    return env


def keep_engine_in_process() -> None:
    """The engine core in this process (also on GPU), so weights can be reloaded in place."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
