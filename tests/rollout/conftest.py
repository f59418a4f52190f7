"""Fixtures of the vLLM rollout tests: the tool caller's checkpoint and one in-process vLLM
engine on it, started once per test worker and shared by the modules that need it
(test_vllm_engine.py, test_vllm_server.py): an engine start costs tens of seconds on 2 cores.
Each module gets it back on the caller's own weights, at version 0, with fresh caches. A test
that starts an engine of its own uses `own_vllm_engines` (tests/conftest.py): vLLM's state is
process-wide."""

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


_shared: list = []  # the worker's engine on the caller, once started


@pytest.fixture(scope="module")
def caller_engine(tool_caller, caller_dir):
    """The worker's vLLM engine on `caller_dir` as a module expects a new one: an earlier module
    may have synced other weights into it, so the caller's are loaded back (version 0; the sync
    resets the prefix, encoder and multimodal caches and the placeholder expansions), or closed
    it to start its own (`own_vllm_engines`), so it starts again."""
    from paravt.rollout import EngineConfig, build_engine

    model, processor = tool_caller
    if _shared and not _shared[0].closed:
        _shared[0].sync_weights(model, version=0)
    else:
        cfg = EngineConfig(name="vllm", max_model_len=4096, max_num_seqs=16)
        _shared[:] = [build_engine(cfg, model, processor, model_path=str(caller_dir))]
    return _shared[0]
