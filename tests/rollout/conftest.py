"""Fixtures of the vLLM rollout tests: the tool caller's checkpoint and one in-process vLLM
engine on it, started once per test worker and shared by the modules that need it
(test_vllm_engine.py, test_vllm_server.py): an engine start costs tens of seconds on 2 cores.
Each module gets it back on the caller's own weights, at version 0, with fresh caches."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def caller_dir(tool_caller, tmp_path_factory):
    """The caller's checkpoint, whose generation_config.json asks for a repetition penalty and
    min-p: vLLM (which reads it) and the transformers engine must sample without them, so every
    comparison with the trainer's log-probs or the transformers engine also checks that they
    are ignored, by the in-process engine and by the rollout servers started on it."""
    from transformers import GenerationConfig

    model, processor = tool_caller
    out = tmp_path_factory.mktemp("tool_caller_vllm")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    GenerationConfig(do_sample=True, repetition_penalty=1.3, min_p=0.5).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def _shared_caller_engine(tool_caller, caller_dir):
    from paravt.rollout import EngineConfig, build_engine

    model, processor = tool_caller
    cfg = EngineConfig(name="vllm", max_model_len=4096, max_num_seqs=16)
    return build_engine(cfg, model, processor, model_path=str(caller_dir))


@pytest.fixture(scope="module")
def caller_engine(_shared_caller_engine, tool_caller):
    """The worker's vLLM engine on `caller_dir` as a module expects a new one: an earlier module
    may have synced other weights into it, so the caller's are loaded back (version 0; the sync
    resets the prefix, encoder and multimodal caches and the placeholder expansions)."""
    _shared_caller_engine.sync_weights(tool_caller[0], version=0)
    return _shared_caller_engine
