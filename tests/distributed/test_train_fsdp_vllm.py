"""`train.py trainer=fsdp_cpu rollout/engine=vllm`: one in-process vLLM engine per rank.

Two CPU processes (gloo), each generating its own prompts with its own `vllm.LLM`, refreshed
after every update from the FSDP2 shards (gathered bucket by bucket). The learning rate is high
enough that stale engine weights would show: after the first update, the behaviour log-probs
vLLM returns must still match the trainer's recomputed ones (`loss/logprob_gap`), and must not
when the engine is allowed to lag one update (`rollout.max_staleness=1`, the control).
Runs in .venv-vllm (`make test-vllm`).
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
    mine = {k.split("=", 1)[0] for k in SETTINGS}
    base = [o for o in overrides if o.split("=", 1)[0] not in mine]
    args = [*base, *(f"{k}={v}" for k, v in SETTINGS.items()), f"hydra.run.dir={run_dir}", *extra]
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
    synced = _train(train_py, tiny_run_overrides, tmp_path / "synced")
    assert synced["weight_version"] == [0.0, 1.0]
    assert synced["grad_norm"][0] > 0  # the first update moved the policy
    assert synced["loss/logprob_gap"][1] < 1e-4  # vLLM sampled with the updated weights
    stale = _train(train_py, tiny_run_overrides, tmp_path / "stale", "rollout.max_staleness=1")
    assert stale["weight_version"] == [0.0, 0.0]
    assert stale["loss/logprob_gap"][1] > 10 * synced["loss/logprob_gap"][1]


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
