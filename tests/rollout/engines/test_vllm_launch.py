"""vLLM under the multi-GPU launcher: placement kwargs and environment, TP refusal, sleep/wake
order.

vLLM's sleep mode exists on GPUs only, so the order is checked on `VLLMEngine` itself with a
recording stand-in for `vllm.LLM` (the engine's own code decides what it calls and when); the
weights streamed through `reload_weights` are the real tiny policy's.
"""

from __future__ import annotations

import json
import os
import socket

import pytest

from paravt.errors import UserError
from paravt.rollout.engines import vllm as vllm_engine
from paravt.rollout.engines.vllm_launch import gpu_launch_kwargs, launch_env
from paravt.rollout.factory import EngineConfig


class RecordingLLM:
    """Records the calls `VLLMEngine` makes on its `vllm.LLM`."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.loaded = 0

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, kwargs):
        self.loaded = sum(1 for _ in kwargs["weights_iterator"])  # consumes the stream
        self.calls.append((method,))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def reset_mm_cache(self):
        self.calls.append(("reset_mm_cache",))


@pytest.fixture
def engine(tiny_qwen3_dir, monkeypatch):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    monkeypatch.setenv("PARAVT_ASSUME_GPU", "1")  # sleep mode is GPU-only
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    cfg = EngineConfig(name="vllm", enable_sleep_mode=True, dtype="float32")
    llm = RecordingLLM()
    eng = vllm_engine.VLLMEngine(llm, processor, cfg)
    eng.empty_cache = lambda: llm.calls.append(("empty_cache",))
    policy = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)
    return eng, llm, policy


def test_sleep_once_per_step_then_wake_weights_sync_then_kv_cache(engine):
    eng, llm, policy = engine
    eng.end_step()  # after the last round of a step
    eng.end_step()  # idempotent: already asleep
    eng.sync_weights(policy, 1)
    assert llm.calls == [
        ("sleep", 1),
        ("empty_cache",),
        ("wake_up", ("weights",)),
        ("reload_weights",),
        ("empty_cache",),
        ("wake_up", ("kv_cache",)),
        ("reset_prefix_cache",),
        ("reset_mm_cache",),
    ]
    assert llm.loaded == len(policy.state_dict()) and eng.weight_version == 1


@pytest.mark.parametrize(("staleness", "level"), [(0, 2), (1, 1)])
def test_the_step_sleep_discards_the_weights_when_a_full_reload_follows(
    engine, needle_dir, staleness, level
):
    from types import SimpleNamespace

    from paravt.modules.rollout_datamodule import RolloutConfig, RolloutDataModule
    from paravt.rollout.engine import GenerationRequest

    eng, llm, policy = engine
    rollout = RolloutConfig(max_staleness=staleness)
    dm = RolloutDataModule(str(needle_dir / "train.jsonl"), batch_size=1, rollout=rollout)
    dm.engine = eng
    dm.end_step()  # level 2 (no host copy) only when the next generation reloads every weight
    assert llm.calls == [("sleep", level)] and eng.needs_sync == (level == 2)
    if level == 2:
        with pytest.raises(RuntimeError, match="call sync_weights before generate"):
            eng.generate([GenerationRequest((1, 2, 3), ())], vllm_engine.SamplingParams())
    dm.sync(SimpleNamespace(policy=policy, policy_version=0), staleness)  # versions agree
    reloaded = ("reload_weights",) in llm.calls
    assert reloaded == (level == 2) and not eng.needs_sync  # a discarded engine is reloaded


def test_generate_between_rounds_never_sleeps(engine):
    eng, llm, _ = engine
    assert eng.generate([], vllm_engine.SamplingParams()) == []
    assert not any(c[0] == "sleep" for c in llm.calls)


def test_an_awake_engine_syncs_without_waking(engine):
    eng, llm, policy = engine
    eng.sync_weights(policy, 3)
    assert [c[0] for c in llm.calls] == ["reload_weights", "reset_prefix_cache", "reset_mm_cache"]


def test_multi_rank_gpu_launch_uses_independent_external_launcher_engines():
    assert gpu_launch_kwargs(1, 1) == {}
    # no data_parallel_size: with it every engine step is an all-reduce over the ranks
    assert gpu_launch_kwargs(1, 8) == {"distributed_executor_backend": "external_launcher"}
    with pytest.raises(UserError, match="tensor_parallel_size=1"):
        gpu_launch_kwargs(2, 8)


def test_llm_kwargs_on_a_gpu_rank_of_eight(monkeypatch):
    monkeypatch.setenv("PARAVT_ASSUME_GPU", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "3")
    kwargs = vllm_engine.llm_kwargs(EngineConfig(name="vllm"), "/m", 4)
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert "data_parallel_size" not in kwargs and kwargs["tensor_parallel_size"] == 1


def test_llm_kwargs_on_cpu_never_split_a_prompt_over_engine_steps(monkeypatch):
    """A split prompt's discarded token makes vLLM rewind a seeded CPU generator, which fails
    ("CPU Generator does not use offset") and kills the engine."""
    monkeypatch.delenv("PARAVT_ASSUME_GPU", raising=False)
    kwargs = vllm_engine.llm_kwargs(EngineConfig(name="vllm", max_model_len=20000), "/m", 4)
    assert kwargs["enable_chunked_prefill"] is False
    assert kwargs["max_num_batched_tokens"] >= 20000  # vLLM requires >= max_model_len then


# What each launcher exports to rank 1 of 2 (one node): Lightning's own launcher
# (lightning/fabric/strategies/launchers/subprocess_script.py) and srun (SLURM_* only). Neither
# sets RANK, which vLLM's external launcher reads (ExecutorWithExternalLauncher._distributed_args
# in vllm/v1/executor/uniproc_executor.py: int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])).
LAUNCHERS = {
    "lightning": {"LOCAL_RANK": "{r}", "NODE_RANK": "0", "WORLD_SIZE": "2"},
    # srun, with a stray offline-DP variable from which vLLM would size a DP group of its own
    "srun": {
        "SLURM_PROCID": "{r}",
        "SLURM_LOCALID": "{r}",
        "SLURM_NTASKS": "2",
        "VLLM_DP_SIZE": "2",
    },
}
LAUNCH_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "SLURM_PROCID", "SLURM_LOCALID")


def _external_launcher_args() -> tuple[int, int]:
    """(rank, local_rank) as vLLM 0.32's external launcher reads them (same expressions)."""
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])


def _rank_worker(rank, world, port, out):
    """One gloo rank: for each launcher's environment, vLLM's view before and after
    `export_launch_env`. CUDA is faked (a GPU-only API): the trainer's device is cuda:rank, as
    Lightning sets it per rank before the engine is built."""
    import torch
    import torch.distributed as dist

    from paravt.rollout.engines.vllm_launch import export_launch_env

    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: rank
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    seen = {}
    for name, env in LAUNCHERS.items():
        for key in LAUNCH_KEYS:
            os.environ.pop(key, None)
        os.environ.update({k: v.format(r=rank) for k, v in env.items()})
        try:
            before = list(_external_launcher_args())
        except KeyError as missing:
            before = f"KeyError {missing}"
        export_launch_env()
        seen[name] = {
            "before": before,
            "after": list(_external_launcher_args()),
            "dp_env": os.environ.get("VLLM_DP_SIZE"),
        }
    dist.destroy_process_group()
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(seen, f)


def test_launch_env_names_the_rank_and_the_trainers_device():
    assert launch_env(3, 8, 3) == {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8"}
    assert launch_env(9, 16, 1) == {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}
    with pytest.raises(ValueError, match="not in a world of size 2"):
        launch_env(2, 2, 0)


def test_each_rank_tells_vllm_its_rank_under_lightning_and_srun(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"{rank}.json").read_text())
        assert seen["lightning"]["before"] == "KeyError 'RANK'"  # vLLM would fail here
        assert seen["srun"]["before"] == "KeyError 'RANK'"
        assert seen["lightning"]["after"] == seen["srun"]["after"] == [rank, rank]
        assert seen["srun"]["dp_env"] is None
