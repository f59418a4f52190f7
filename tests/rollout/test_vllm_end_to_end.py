"""`train.py` and `evaluate.py` with `rollout/engine=vllm`, as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from paravt.eval.runner import METRICS, PREDICTIONS

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]


def _run(
    train_py, script: str, overrides: list[str], timeout: int = 540
) -> subprocess.CompletedProcess:
    run = train_py(*overrides, script=script, timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]
    return run


def test_two_rl_steps_with_the_vllm_engine(train_py, tmp_path, tiny_run_overrides):
    overrides = [
        "rollout/engine=vllm",
        "trainer.max_steps=2",
        "cold_start=null",
        f"run_dir={tmp_path}",
        f"hydra.run.dir={tmp_path}",
        *tiny_run_overrides,
        "rollout.agent.max_rounds=1",
        "rollout.agent.max_new_tokens=12",
        "rollout.agent.max_total_tokens=4096",
        "rollout.engine.max_model_len=4608",
        "callbacks.frame_budget_gating.frame_budgets=[4,8]",
        "callbacks.benchmark_validation=null",
        "export_hf=false",
    ]
    _run(train_py, "train.py", overrides)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    # Step 1 sampled with the weights after update 0, pushed into vLLM by sync_weights.
    assert [e.value for e in acc.Scalars("weight_version")] == [0.0, 1.0]
    syncs = [e.value for e in acc.Scalars("time/sync")]
    assert len(syncs) == 2 and syncs[1] > 0
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


@pytest.fixture(scope="module")
def caller_ckpt(tool_caller, tmp_path_factory):
    model, processor = tool_caller
    out = tmp_path_factory.mktemp("tool_caller_eval")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def test_evaluate_with_vllm_equals_the_transformers_engine(
    train_py, caller_ckpt, needle_dir, tmp_path
):
    """One `evaluate.py -m rollout/engine=hf,vllm` sweep (one process, two jobs), each job
    writing its own out_dir: the vLLM job's predictions and metrics equal the transformers'."""
    _run(
        train_py,
        "evaluate.py",
        [
            "-m",
            "rollout/engine=hf,vllm",
            "benchmark=needle",
            f"model.path={caller_ckpt}",
            "model.build_tiny=null",
            f"benchmark.annotations={needle_dir / 'eval.jsonl'}",
            f"out_dir={tmp_path}/${{rollout.engine.name}}",
            f"hydra.sweep.dir={tmp_path / 'hydra'}",
            "device=cpu",
            "protocol.frame_budget=4",
            "rollout.agent.max_rounds=2",
            "rollout.agent.max_new_tokens=160",
            "rollout.agent.max_total_tokens=4096",
            "protocol.batch_size=2",
            "++rollout.engine.max_model_len=4608",  # read by the vLLM engine only
        ],
    )
    results = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / engine
        records = [json.loads(x) for x in (out / PREDICTIONS).read_text().splitlines()]
        results[engine] = (json.loads((out / METRICS).read_text()), records)
    (hf_metrics, hf_records), (vllm_metrics, vllm_records) = results["hf"], results["vllm"]
    assert all(r["num_valid_calls"] >= 1 for r in hf_records)  # a real tool-calling run
    keep = ("id", "answer", "response", "num_calls", "num_valid_calls", "rounds", "score")
    assert [{k: r.get(k) for k in keep} for r in vllm_records] == [
        {k: r.get(k) for k in keep} for r in hf_records
    ]
    assert vllm_metrics["metrics"] == hf_metrics["metrics"]
    assert (hf_metrics["run"]["engine"], vllm_metrics["run"]["engine"]) == ("hf", "vllm")
