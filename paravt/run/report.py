"""Held-out evaluation per frame budget and the before/after table of a run.

`budget_eval` runs the policy greedily on the same held-out samples at each overview budget K
(accuracy, f_tau, kappa, the standard error of the accuracy and, with more than one tool, the
share of samples calling each tool and all of them); `before_after_table` and
`tool_share_table` lay two such measurements side by side. Pure formatting apart from
`budget_eval`'s rollouts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from paravt.agent.greedy import greedy_rollouts
from paravt.rl.metrics import format_compliance
from paravt.rollout.engine import SamplingParams
from paravt.types import Sample


@dataclass(frozen=True)
class BudgetResult:
    """Greedy held-out figures at one frame budget."""

    budget: int
    samples: int
    accuracy: float
    f_tau: float
    kappa: float  # tool calls per trajectory
    # With more than one tool: (tool, share of samples that called it) per tool in toolbox
    # order, then ("all", share that called every tool); () with one tool.
    tool_shares: tuple[tuple[str, float], ...] = ()

    @property
    def stderr(self) -> float:
        """Standard error of the accuracy (binomial)."""
        p = self.accuracy
        return math.sqrt(max(p * (1 - p), 0.0) / max(self.samples, 1))


def budget_eval(
    module, agent, samples: Sequence[Sample], budgets: Sequence[int]
) -> list[BudgetResult]:
    """Run `agent` greedily on `samples` at every budget with `module.policy`'s current weights
    (the engine is synced first: `greedy_rollouts`); score them with `module.score`."""
    out = []
    names = list(agent.executor.tools) if len(agent.executor.tools) > 1 else []
    was_training = module.policy.training
    module.policy.eval()
    for k in budgets:
        trajs = greedy_rollouts(
            agent,
            samples,
            [k] * len(samples),
            module.policy,
            module.policy_version,
            SamplingParams(greedy=True),
        )
        rewards = [module.score(t, s) for t, s in zip(trajs, samples, strict=True)]
        n = max(len(samples), 1)
        out.append(
            BudgetResult(
                budget=k,
                samples=len(samples),
                accuracy=sum(r.accuracy for r in rewards) / n,
                f_tau=sum(format_compliance(r) for r in rewards) / n,
                kappa=sum(t.num_calls for t in trajs) / n,
                tool_shares=tool_shares(trajs, names),
            )
        )
    module.policy.train(was_training)
    return out


def tool_shares(trajs: Sequence, names: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """(tool, share of `trajs` with a call of it) per name, then ("all", share calling every
    name); () for no names. A call counts once it parsed, whatever its result."""
    if not names:
        return ()
    called = [
        {p.call.name for turn in t.turns for p in turn.calls if p.call is not None} for t in trajs
    ]
    n = max(len(trajs), 1)
    shares = [(name, sum(name in c for c in called) / n) for name in names]
    return (*shares, ("all", sum(set(names) <= c for c in called) / n))


def pooled(results: Sequence[BudgetResult]) -> BudgetResult:
    """All budgets' samples pooled into one figure (budget 0 stands for "all")."""
    n = sum(r.samples for r in results)

    def mean(attr: str) -> float:
        return sum(getattr(r, attr) * r.samples for r in results) / max(n, 1)

    names = [name for name, _ in results[0].tool_shares] if results else []
    shares = tuple(
        (name, sum(dict(r.tool_shares)[name] * r.samples for r in results) / max(n, 1))
        for name in names
    )
    return BudgetResult(0, n, mean("accuracy"), mean("f_tau"), mean("kappa"), shares)


def before_after_table(
    columns: Mapping[str, Sequence[BudgetResult]],
) -> list[str]:
    """Rows `budget | accuracy +- se | f_tau | kappa` for each named column (e.g. before, after)."""
    names = list(columns)
    head = "  budget" + "".join(
        f" | {n + ': accuracy (se)':>24} {'f_tau':>5} {'kappa':>5}" for n in names
    )
    lines = [head]
    rows = budget_rows(columns)
    for label, cells in rows:
        text = f"  {label:<6}"
        for r in cells:
            if r is None:
                text += f" | {'-':>24} {'-':>5} {'-':>5}"
            else:
                acc = f"{r.accuracy:.3f} ({r.stderr:.3f}, n={r.samples})"
                text += f" | {acc:>24} {r.f_tau:5.3f} {r.kappa:5.2f}"
        lines.append(text)
    return lines


def budget_rows(
    columns: Mapping[str, Sequence[BudgetResult]],
) -> list[tuple[str, list[BudgetResult | None]]]:
    """(label, each column's result or None) for every budget any column has, then "all"
    (each column pooled over its budgets)."""
    by_budget = [{r.budget: r for r in results} for results in columns.values()]
    budgets = sorted({k for col in by_budget for k in col})
    rows = [(f"K={k}", [col.get(k) for col in by_budget]) for k in budgets]
    rows.append(("all", [pooled(results) if results else None for results in columns.values()]))
    return rows


def tool_share_table(columns: Mapping[str, Sequence[BudgetResult]]) -> list[str]:
    """Rows `budget | share of samples calling each tool, and all of them` per named column;
    [] when the results hold no shares (a toolbox of one tool)."""
    names = list(columns)
    first = next((r for n in names for r in columns[n]), None)
    if first is None or not first.tool_shares:
        return []
    tools = [name for name, _ in first.tool_shares]
    width = max(len(t) for t in tools)
    cells = " ".join(f"{t:>{width}}" for t in tools)
    lines = ["  budget" + "".join(f" | {n}: {cells}" for n in names)]
    rows = budget_rows(columns)
    for label, results in rows:
        text = f"  {label:<6}"
        for name, r in zip(names, results, strict=True):
            shares = dict(r.tool_shares) if r is not None else {}
            text += f" | {' ' * len(name)}  " + " ".join(
                f"{shares[t]:>{width}.3f}" if t in shares else f"{'-':>{width}}" for t in tools
            )
        lines.append(text)
    return lines


def gain_line(before: Sequence[BudgetResult], after: Sequence[BudgetResult]) -> str:
    """The pooled held-out accuracy change in points, with the standard error of the change
    (the two measurements' errors combined as if independent, which overstates it for the
    same samples)."""
    b, a = pooled(before), pooled(after)
    se = math.sqrt(b.stderr**2 + a.stderr**2)
    return (
        f"held-out accuracy, all budgets: {b.accuracy:.3f} -> {a.accuracy:.3f} "
        f"({100 * (a.accuracy - b.accuracy):+.1f} points, se {100 * se:.1f}; n={a.samples})"
    )
