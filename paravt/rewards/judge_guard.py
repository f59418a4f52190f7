"""When an LLM judge's fallbacks stop training: the fallback share over the last steps.

A judge that cannot be reached scores every open-ended answer by token F1 instead; left alone,
a run can train for hours on that fallback. `JudgeGuard.update(calls, fallbacks, ...)` takes one
step's counts (summed over ranks by the caller, so every rank decides alike), returns the step's
metrics and raises `JudgeFailure`, naming the endpoint and the last failure, when the share of
fallbacks over the last `window` steps that called the judge exceeds `max_share`. The default,
`max_share=0.0, window=1`, stops at the first step with any fallback (after the judge's own
retries); `max_share=0.2, window=10` tolerates one answer in five over ten steps (before ten
judged steps have been seen, only a share of 1, every answer fell back, stops).

Pure: plain numbers in, a dict out; it deliberately makes no request and reads no config.
"""

from __future__ import annotations

import math
from collections import deque

from paravt.errors import UserError


class JudgeFailure(UserError):
    """The judge fell back more than the configured share: training must not go on silently."""


class JudgeGuard:
    """Fallback share of the last `window` judged steps against `max_share`."""

    def __init__(self, max_share: float = 0.0, window: int = 1) -> None:
        if not (math.isfinite(max_share) and 0.0 <= max_share <= 1.0):
            raise ValueError(f"JudgeGuard max_share must be in [0, 1], got {max_share!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"JudgeGuard window must be an int >= 1 (steps), got {window!r}")
        self.max_share, self.window = max_share, window
        self._steps: deque[tuple[int, int]] = deque(maxlen=window)

    def update(
        self, calls: int, fallbacks: int, endpoint: str, last_error: str | None
    ) -> dict[str, float]:
        """Record one step; its metrics, or JudgeFailure when the share is over the limit."""
        if not 0 <= fallbacks <= calls:
            raise ValueError(f"need 0 <= fallbacks <= calls, got {fallbacks} of {calls}")
        metrics = {
            "judge/calls": float(calls),
            "judge/fallbacks": float(fallbacks),
            "judge/fallback_rate": fallbacks / calls if calls else 0.0,
        }
        if calls == 0:  # no open-ended answer this step: nothing to judge, nothing to count
            return metrics
        self._steps.append((calls, fallbacks))
        total = sum(c for c, _ in self._steps)
        failed = sum(f for _, f in self._steps)
        share = failed / total
        if share > self.max_share and (len(self._steps) == self.window or failed == total):
            raise JudgeFailure(
                f"LLM judge at {endpoint}: {failed} of {total} answers over the last "
                f"{len(self._steps)} judged step(s) fell back to token F1 (share {share:.2f} > "
                f"max_share {self.max_share}); last failure: {last_error}. Fix the judge server "
                "(or raise judge.guard.max_share / judge.guard.window)"
            )
        return metrics
