"""Per-tool health figures of a step's rollouts: calls (kappa per tool), errors, timeouts,
latency and frames returned, one set of keys per tool that was called.

    kappa/<tool>             calls of the tool per rollout (kappa overall sums them)
    tool/<tool>/errors       share of its calls that came back as an error text
    tool/<tool>/timeouts     share of its calls that ran past the tool's timeout
    tool/<tool>/latency_s    mean seconds a call of it ran (calls that reached the tool)
    tool/<tool>/frames       mean frames per successful result (0 for a text tool)
    tools/mixed              share of rollouts calling more than one tool (only once more
                             than one tool was called: whether a policy combines its tools)

A call the parser could not read has no tool name and counts in kappa only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from paravt.types import ToolResult, Trajectory


def tool_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The per-tool keys above over `trajs` (empty when no tool was called)."""
    results: dict[str, list[ToolResult]] = defaultdict(list)
    calls: dict[str, int] = defaultdict(int)
    mixed = 0
    for traj in trajs:
        names = [p.call.name for turn in traj.turns for p in turn.calls if p.call is not None]
        mixed += len(set(names)) > 1
        for name in names:
            calls[name] += 1
        for turn in traj.turns:
            for result in turn.results:
                if result.name:
                    results[result.name].append(result)
    n = max(len(trajs), 1)
    out: dict[str, float] = {}
    for name in sorted(set(calls) | set(results)):
        done = results[name]
        ran = [r.latency_s for r in done if r.latency_s > 0]
        good = [r for r in done if r.ok]
        out[f"kappa/{name}"] = calls[name] / n
        out[f"tool/{name}/errors"] = sum(not r.ok for r in done) / max(len(done), 1)
        out[f"tool/{name}/timeouts"] = sum(r.timed_out for r in done) / max(len(done), 1)
        out[f"tool/{name}/latency_s"] = sum(ran) / max(len(ran), 1)
        frames = sum(len(r.frames.indices) for r in good if r.frames is not None)
        out[f"tool/{name}/frames"] = frames / max(len(good), 1)
    if len(calls) > 1:
        out["tools/mixed"] = mixed / n
    return out
