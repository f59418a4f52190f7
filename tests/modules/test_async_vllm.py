"""rollout.mode=async with the vLLM engine in the generator process (and partial rollouts).

A short Lightning fit on the tiny Qwen3-VL, max_staleness 1: the generator (its own process,
its own in-process `vllm.LLM`) samples step t+1 while the trainer updates on step t. For every
trained batch the behaviour log-probs vLLM returned are recomputed teacher-forced by the
trainer's policy at the version the batch says it was sampled under (snapshots of the weights
taken at every version): they agree within the vLLM sync tests' 1e-4, and they do not agree with
the previous version's weights, so each publish reached the generator's engine.
Runs in .venv-vllm (`make test-vllm`).
"""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import pytest
import torch

from paravt.models.forward import TokenIds, trajectory_logprobs
from tests.generator.test_async_rollouts import ASYNC, fit, gone, scalars

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.usefixtures("own_vllm_engines"),  # each run starts its own in-process engine
]
VLLM = [
    "rollout/engine=vllm",
    "rollout.engine.max_model_len=4608",
    "rollout.engine.mm_processor_cache_gb=0.5",
    "rollout.max_staleness=1",
    "algorithm.loss=decoupled_ppo",
    "data.batch_size=2",
    "rollout.group_size=4",
    "rollout.temperature=1.2",
    "rollout.agent.max_new_tokens=24",
    "trainer.max_steps=4",
]


class Versions(pl.Callback):
    """The trained batches and a copy of the policy's weights at every version."""

    def __init__(self):
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.batches = []  # (weight_version, trajectories)
        self.steps: list[tuple[int, int]] = []  # (step, weight_version)
        self.pids: set[int] = set()

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        state = module.policy.state_dict()
        self.weights[module.policy_version] = {k: v.detach().clone() for k, v in state.items()}
        self.batches.append((batch.weight_version, batch.trajectories))
        self.steps.append((batch.step, batch.weight_version))
        self.pids.add(trainer.datamodule.async_rollouts.generator.pid)


def _gap(model, processor, trajs, temperature: float, version: int | None = None) -> float:
    """max |teacher-forced - behaviour| log-prob over the sampled tokens of `trajs` (those
    sampled by `version` alone, when given; 0 when there are none)."""
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    with torch.no_grad():
        logp, batch, _ = trajectory_logprobs(model, list(trajs), ids, temperature)
    mask = batch.loss_mask
    if version is not None:
        width = mask.shape[1]
        rows = [list(t.versions) + [-1] * (width - len(t.versions)) for t in trajs]
        mask = mask & (torch.tensor(rows) == version)
    if not mask.any():
        return 0.0
    return (logp[mask] - batch.old_logp[mask]).abs().max().item()


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "partial"])
def test_async_vllm_generator_samples_with_each_published_version(
    tmp_path, tiny_qwen3_dir, needle_dir, partial
):
    seen = Versions()
    extra = [*VLLM, *ASYNC, f"rollout.partial={partial}"]
    run = fit(tmp_path, tiny_qwen3_dir, needle_dir, *extra, callbacks=[seen])
    assert len(seen.pids) == 1 and all(gone(p) for p in seen.pids)
    # The staleness contract: generated one step ahead, never more than 1 update behind.
    assert seen.steps == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert scalars(tmp_path, "rollout/staleness") == [0.0, 1.0, 1.0, 1.0]
    assert scalars(tmp_path, "rollout/stale_dropped") == [0.0] * 4
    # Some update moved the policy (update v - 1 makes version v; a step whose groups all
    # scored alike has no gradient, and which steps do depends on the sampling).
    norms = scalars(tmp_path, "grad_norm")
    assert any(g > 0 for g in norms[:3])
    # The behaviour log-probs are those of the version each batch was sampled under.
    model = copy.deepcopy(run.module.policy).eval()
    processor, temperature = run.module.processor, 1.2
    for version, trajs in seen.batches:
        model.load_state_dict(seen.weights[version])
        gap = _gap(model, processor, trajs, temperature)
        assert gap <= 1e-4, (version, gap)
        # Token by token: each segment's log-probs are those of the version that sampled it
        # (with partial rollouts a trajectory may hold several; all are checked).
        for v in {v for t in trajs for v in t.versions}:
            model.load_state_dict(seen.weights[v])
            assert _gap(model, processor, trajs, temperature, v) <= 1e-4, (version, v)
        model.load_state_dict(seen.weights[version])
        if version > 0 and norms[version - 1] > 0:  # not the previous version's either
            model.load_state_dict(seen.weights[version - 1])
            assert _gap(model, processor, trajs, temperature) > 1e-3, version
