"""vLLM's per-step notices are shown once, other records pass (no vLLM needed)."""

from __future__ import annotations

import logging

from paravt.rollout.engines.vllm import _FirstTimeOnly


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("vllm.v1.worker", logging.WARNING, "x.py", 1, msg, args, None)


def test_each_known_notice_passes_once_and_other_records_always():
    gate = _FirstTimeOnly()
    threads = "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding"
    first = _record(threads)
    assert gate.filter(first) and "shown once" in first.getMessage()
    assert not any(gate.filter(_record(threads)) for _ in range(30))
    took = "Reloading and processing weights took %.2f seconds"
    assert gate.filter(_record(took, 0.12)) and not gate.filter(_record(took, 0.31))
    assert gate.filter(_record("RotaryEmbedding: Failed to load weights"))
    assert not gate.filter(_record("MRotaryEmbedding: Failed to load weights"))
    for _ in range(3):  # anything else is never held back
        other = _record("KV cache size %d tokens", 4096)
        assert gate.filter(other) and other.getMessage() == "KV cache size 4096 tokens"
