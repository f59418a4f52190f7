"""Greedy evaluation rollouts: the one path every evaluator takes.

Held-out validation during training (`BenchmarkValidation` -> `RolloutDataModule.evaluate`), the
run's per-budget before/after report (`paravt.run.report.budget_eval`) and benchmark evaluation
(`paravt.eval.runner`) all call `greedy_rollouts`. It first brings the engine to the policy's
current weights (`WeightSync.to_version`): an engine with weights of its own (vLLM, or the
transformers copy kept for `rollout.max_staleness > 0`) otherwise measures older weights, e.g.
the ones from before the cold start, or one update behind at the end of training. Then one
greedy trajectory per sample at its frame budget.

This module deliberately scores nothing: each evaluator scores with its own rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from paravt.agent.loop import AgentLoop
from paravt.rollout.engine import SamplingParams
from paravt.rollout.sync.weight_sync import WeightSync
from paravt.types import AgentRun, Sample


def greedy_rollouts(
    agent: AgentLoop,
    samples: Sequence[Sample],
    budgets: Sequence[int],
    policy: Any | None = None,
    version: int = 0,
    params: SamplingParams | None = None,
    skip_bad_videos: bool = False,
) -> AgentRun:
    """One greedy trajectory per sample, with the engine synced to (`policy`, `version`) first.

    `params` defaults to greedy decoding at the agent's per-turn token cap."""
    WeightSync.to_version(agent.engine, policy, version)
    params = params or SamplingParams(greedy=True, max_new_tokens=agent.cfg.max_new_tokens)
    return agent.run(list(samples), list(budgets), 1, params, skip_bad_videos=skip_bad_videos)
