"""evaluate.py loads the policy's weights only for an engine that generates with them: vLLM reads
`model.path` itself, so the HF model is a meta-device skeleton there (a second copy of the
weights on the GPU would take the memory vLLM's start-up check asks for)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from paravt.rollout.factory import check_context, engine_dtype

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("engine", "weightless"), [("hf", False), ("vllm", True), ("vllm_server", True)]
)
def test_the_weights_are_loaded_only_for_the_transformers_engine(
    engine, weightless, tiny_qwen3_dir
):
    from evaluate import load_model, policy_spec

    overrides = [f"rollout/engine={engine}", f"model.path={tiny_qwen3_dir}", "device=cpu"]
    overrides.append("rollout.agent.max_total_tokens=4096")  # the tiny model's context: 8,192
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("eval", overrides=[*overrides, "model.build_tiny=null"])
    model, processor = load_model(cfg, policy_spec(cfg))
    assert {p.is_meta for p in model.parameters()} == {weightless}
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert processor.tokenizer.convert_ids_to_tokens(end) == "<|im_end|>"  # a real token
    # What the vLLM engine reads of the module before it starts still holds on the skeleton.
    engine_cfg = instantiate(cfg.rollout.engine)
    check_context(engine_cfg.max_model_len, model.config)
    assert engine_dtype(engine_cfg, model) == torch.float32  # the tiny model's model.dtype


@pytest.mark.parametrize(
    ("extra", "share"), [([], 0.9), (["rollout.engine.gpu_memory_utilization=0.6"], 0.6)]
)
def test_vllm_takes_the_gpu_the_evaluation_has_alone(extra, share, monkeypatch):
    """Issue 50, finding 10: evaluate.py kept training's share 0.5 (made for a trainer beside
    the engine). The GPU decision is forced here (PARAVT_ASSUME_GPU=1); the command line wins."""
    from paravt.rollout.engines.vllm import llm_kwargs

    monkeypatch.setenv("PARAVT_ASSUME_GPU", "1")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("eval", overrides=["rollout/engine=vllm", *extra])
    engine_cfg = instantiate(cfg.rollout.engine)
    assert llm_kwargs(engine_cfg, "/m", 4, world=1)["gpu_memory_utilization"] == share
