"""`train.py trainer=fsdp_cpu rollout/engine=vllm`: one in-process vLLM engine per rank.

Two CPU processes (gloo), each generating its own prompts with its own `vllm.LLM`, refreshed
from the FSDP2 shards (gathered bucket by bucket) whenever it lags by more than
`rollout.max_staleness` updates. The learning rate is high enough that stale engine weights
would show in `loss/logprob_gap` (the behaviour log-probs vLLM returned against the trainer's
recomputed ones): one run at max_staleness 1 holds the control (step 1 samples with the
weights before update 0) and the sync (step 2 samples with the weights gathered after update
1) in one launch. Runs in .venv-vllm (`make test-vllm`).
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {
    "trainer": "fsdp_cpu",
    "rollout/engine": "vllm",
    "rollout.engine.max_model_len": "4096",
    "cold_start": "null",
    "model.freeze_vision": "true",
    "data.batch_size": "4",
    "rollout.group_size": "4",
    "rollout.temperature": "1.2",
    "rollout.agent.max_new_tokens": "32",
    "algorithm.kl_coef": "0.1",
    "optimizer.lr": "1e-3",
    "trainer.max_steps": "2",
    "callbacks.benchmark_validation": "null",
}


def _train(train_py, overrides: list[str], run_dir: Path, *extra: str) -> dict[str, list[float]]:
    settings = SETTINGS | dict(e.split("=", 1) for e in extra)  # a test's own values win
    base = [o for o in overrides if o.split("=", 1)[0] not in settings]
    args = [*base, *(f"{k}={v}" for k, v in settings.items()), f"hydra.run.dir={run_dir}"]
    proc = train_py(*args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "MEMBER: 2/2" in out and out.count("== paravt run") == 1
    return _scalars(run_dir / "tb")


def _scalars(tb: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {}
    for path in sorted(glob.glob(str(tb / "**" / "events*"), recursive=True)):
        acc = EventAccumulator(path)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return out


def test_each_rank_s_vllm_engine_follows_the_sharded_policy(train_py, tiny_run_overrides, tmp_path):
    """At max_staleness 1 the engines skip the sync before step 1 and sync before step 2: step 1
    is the stale control, step 2 the gathered weights' check, in one 2-rank launch."""
    run = _train(
        train_py,
        tiny_run_overrides,
        tmp_path / "run",
        "trainer.max_steps=3",
        "rollout.max_staleness=1",
    )
    assert run["weight_version"] == [0.0, 0.0, 2.0]  # lag 1 allowed, lag 2 synced
    assert run["grad_norm"][0] > 0  # the first update moved the policy
    assert run["loss/logprob_gap"][0] < 1e-4  # the engines start on the policy's weights
    assert run["loss/logprob_gap"][2] < 1e-4  # sampled with the weights gathered after update 1
    assert run["loss/logprob_gap"][1] > 10 * run["loss/logprob_gap"][2]  # stale would show


def test_rank_0_s_async_vllm_generator_follows_the_sharded_policy(
    train_py, tiny_run_overrides, tmp_path
):
    """`rollout.mode=async` on the same 2 ranks: rank 0's generator process runs vLLM, and
    after each update the weights gathered from the shards are published to it. At
    max_staleness 0 step 1 is sampled after update 0 reached the generator's engine, so its
    behaviour log-probs match the trainer's recomputed ones as closely as in sync mode."""
    run = _train(
        train_py,
        tiny_run_overrides,
        tmp_path / "async",
        "rollout.mode=async",
        "rollout.max_staleness=0",
    )
    assert run["weight_version"] == [0.0, 1.0]
    assert run["rollout/staleness"] == [0.0, 0.0]
    assert run["grad_norm"][0] > 0  # the first update moved the policy
    assert run["loss/logprob_gap"][1] < 1e-4  # vLLM in the generator sampled with it
