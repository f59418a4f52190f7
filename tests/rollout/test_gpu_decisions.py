"""The GPU placement and launch decisions, taken on CPU with PARAVT_ASSUME_GPU=1.

`paravt.parallel.placement`: the decisions (external launcher, memory share, sleep mode, weight
transfer, the GPUs a child sees) follow `gpu_placement()`, the CPU backend's own arguments follow
the hardware. These tests take the GPU side of each decision on this CPU; the rollout server's
own decision under a launcher is checked for real in tests/rollout/serving/test_vllm_server.py.
"""

from __future__ import annotations

import pytest

from paravt.parallel.placement import ASSUME_GPU_ENV, gpu_placement, visible_gpus
from paravt.rollout.engines import vllm as vllm_engine
from paravt.rollout.factory import EngineConfig
from paravt.rollout.serving.launch import server_env

# What Lightning's launcher leaves in rank 0's environment for a 7-rank trainer (paragrpo_1p7),
# plus srun's and torchelastic's, and what a server must keep.
LAUNCHED = {
    "WORLD_SIZE": "7",
    "LOCAL_RANK": "0",
    "NODE_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "SLURM_PROCID": "0",
    "TORCHELASTIC_RUN_ID": "x",
    "PATH": "/bin",
    ASSUME_GPU_ENV: "1",
}


def test_forced_gpu_decisions_keep_the_cpu_backends_own_arguments(monkeypatch):
    """Forced: the placement arguments of a GPU; the CPU backend still eager, no chunked
    prefill (it dies without them, tests/rollout/engines/test_vllm_launch.py)."""
    monkeypatch.setenv(ASSUME_GPU_ENV, "1")
    for key in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)
    cfg = EngineConfig(name="vllm", gpu_memory_utilization=0.3, enable_sleep_mode=True)
    kwargs = vllm_engine.llm_kwargs(cfg, "/m", 4)
    assert kwargs["gpu_memory_utilization"] == 0.3 and kwargs["enable_sleep_mode"] is True
    assert kwargs["tensor_parallel_size"] == 1 and "distributed_executor_backend" not in kwargs
    assert kwargs["enforce_eager"] is True and kwargs["enable_chunked_prefill"] is False


def test_without_the_variable_the_hardware_decides(monkeypatch):
    monkeypatch.delenv(ASSUME_GPU_ENV, raising=False)
    assert gpu_placement() is False  # this CPU machine
    kwargs = vllm_engine.llm_kwargs(EngineConfig(name="vllm"), "/m", 4)
    assert "gpu_memory_utilization" not in kwargs and kwargs["enforce_eager"] is True
    from paravt.errors import UserError
    from paravt.rollout.serving.nccl import check_cuda

    with pytest.raises(UserError, match="weight_transfer=nccl needs CUDA GPUs"):
        check_cuda("nccl")
    with pytest.raises(ValueError, match="PARAVT_ASSUME_GPU='yes'"):
        gpu_placement({ASSUME_GPU_ENV: "yes"})


def test_forced_nccl_weight_transfer_is_asked_of_vllm(monkeypatch):
    from paravt.rollout.serving.nccl import check_cuda

    monkeypatch.setenv(ASSUME_GPU_ENV, "1")
    check_cuda("nccl")  # the trainer's check: passes as on a GPU (refused without, below)
    cfg = EngineConfig(name="vllm", weight_transfer="nccl")
    assert vllm_engine.llm_kwargs(cfg, "/m", 4)["weight_transfer_config"] == {"backend": "nccl"}


def test_a_standalone_engine_never_takes_the_external_launcher(monkeypatch):
    """Finding 1: a server started by rank 0 of a 7-rank launch read WORLD_SIZE=7 and took the
    external launcher on a GPU (init_process_group on the trainer's MASTER_PORT: EADDRINUSE)."""
    monkeypatch.setenv(ASSUME_GPU_ENV, "1")
    monkeypatch.setenv("WORLD_SIZE", "7")
    cfg = EngineConfig(name="vllm")
    launched = vllm_engine.llm_kwargs(cfg, "/m", 4)
    assert launched["distributed_executor_backend"] == "external_launcher"  # a rank's engine
    assert "distributed_executor_backend" not in vllm_engine.llm_kwargs(cfg, "/m", 4, world=1)


def test_a_servers_environment_drops_the_launch_and_keeps_the_forcing():
    env = server_env(LAUNCHED, EngineConfig(name="vllm_server", kv_cache_gb=3))
    assert not {"WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env)
    assert "SLURM_PROCID" not in env and "TORCHELASTIC_RUN_ID" not in env
    assert env[ASSUME_GPU_ENV] == "1" and env["PATH"] == "/bin"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and "CUDA_VISIBLE_DEVICES" not in env


def test_server_gpus_map_through_the_inherited_visible_devices():
    """Finding 9: under SLURM's CUDA_VISIBLE_DEVICES=4,5,6,7 the configured GPU 3 is the job's
    fourth, id 7 (it was passed on as "3": a GPU outside the job)."""
    cfg = EngineConfig(name="vllm_server", num_servers=1, tensor_parallel_size=2, devices=[2, 3])
    env = server_env(LAUNCHED | {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, cfg, cfg.server_gpus(0))
    assert env["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert server_env(LAUNCHED, cfg, (2, 3))["CUDA_VISIBLE_DEVICES"] == "2,3"  # none inherited
    with pytest.raises(ValueError, match="GPU 4 is not among CUDA_VISIBLE_DEVICES=4,5"):
        visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5"}, [4])


def test_fsdp_computes_in_bf16_on_cuda():
    """`mixed_precision`'s GPU side: bf16 compute, fp32 gradient reduction (a plain choice of
    dtypes, taken here without CUDA)."""
    import torch

    from paravt.parallel.fsdp import mixed_precision

    gpu = mixed_precision("cuda")
    assert (gpu.param_dtype, gpu.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision("cpu").param_dtype is None  # fp32 throughout
