"""vLLM under the multi-GPU launcher: placement kwargs, TP refusal, sleep/wake order.

vLLM's sleep mode exists on GPUs only, so the order is checked on `VLLMEngine` itself with a
recording stand-in for `vllm.LLM` (the engine's own code decides what it calls and when); the
weights streamed through `reload_weights` are the real tiny policy's.
"""

from __future__ import annotations

import pytest

from paravt.errors import UserError
from paravt.rollout import vllm as vllm_engine
from paravt.rollout.factory import EngineConfig
from paravt.rollout.vllm_launch import gpu_launch_kwargs


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

    monkeypatch.setattr(vllm_engine, "_on_gpu", lambda: True)  # sleep mode is GPU-only
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


def test_multi_rank_gpu_launch_uses_the_external_launcher():
    assert gpu_launch_kwargs(1, 1) == {}
    assert gpu_launch_kwargs(1, 8) == {
        "distributed_executor_backend": "external_launcher",
        "data_parallel_size": 8,
    }
    with pytest.raises(UserError, match="tensor_parallel_size=1"):
        gpu_launch_kwargs(2, 8)


def test_llm_kwargs_on_a_gpu_rank_of_eight(monkeypatch):
    monkeypatch.setattr(vllm_engine, "_on_gpu", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "3")
    kwargs = vllm_engine.llm_kwargs(EngineConfig(name="vllm"), "/m", 4)
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["data_parallel_size"] == 8 and kwargs["tensor_parallel_size"] == 1
