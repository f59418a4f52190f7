"""An LLM judge for open-ended answers through any OpenAI-compatible chat endpoint.

`LLMJudge(prediction, gold, question="")` POSTs `{base_url}/chat/completions` with a JSON body
`{"model", "messages", "temperature": 0, "max_tokens"}` (and `Authorization: Bearer <api_key>`
when a key is given), using only the standard library, and maps the reply to 1 / 0.5 / 0.

The prompt (JUDGE_SYSTEM_PROMPT + JUDGE_USER_TEMPLATE below) asks for exactly one word:
CORRECT (1.0), PARTIAL (0.5) or INCORRECT (0.0). A bare number in [0, 1] is accepted too and
snapped to the nearest of 0 / 0.5 / 1. A failed request (timeout, connection error, HTTP 5xx or
429, a body that is not an OpenAI reply) is retried `retries` times with exponential backoff
(`backoff`, 2x, 4x ... seconds); an HTTP 4xx or an unparsable verdict is not. When it still fails
the judge falls back to token F1 and counts it in `num_fallbacks` (the reason in `last_error`).

`verdict(...)` is the same without the fallback: None when the judge failed (counted), so an
evaluation can fall back to its benchmark's own rule. `prefetch(items)` scores a step's answers
concurrently (a pool of at most `max_workers` threads) into a cache that `__call__` and
`verdict` read, so the reward code keeps calling the judge one answer at a
time; `take_stats()` returns what happened since the last call (calls, fallbacks, last error)
and empties the cache. Whether a share of fallbacks stops training is `judge_guard`'s decision.
This module holds no credentials itself: the caller passes `api_key` (e.g. from an environment
variable read by the glue).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from paravt.rewards.accuracy import token_f1

JUDGE_SYSTEM_PROMPT = (
    "You grade answers to questions about videos. Compare the candidate answer with the "
    "reference answer. Reply with exactly one word: CORRECT if the candidate means the same as "
    "the reference, PARTIAL if it is partly right or incomplete, INCORRECT otherwise."
)
JUDGE_USER_TEMPLATE = (
    "Question: {question}\nReference answer: {gold}\nCandidate answer: {prediction}\nVerdict:"
)

# The first verdict word wins; "partially correct" and "not correct" are read as whole phrases.
_VERDICT_RE = re.compile(r"\b(INCORRECT|NOT\s+CORRECT|PARTIAL(?:LY)?|CORRECT)\b", re.I)
_NUMBER_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])")
_VERDICT_SCORES = {"correct": 1.0, "partial": 0.5, "partially": 0.5, "incorrect": 0.0, "not": 0.0}
# Errors a network call or a malformed reply can raise; anything else is a bug and propagates.
_JUDGE_ERRORS = (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError)


@dataclass(frozen=True)
class JudgeStats:
    """What a judge did since the last `take_stats()`: answers asked, how many fell back."""

    calls: int = 0
    fallbacks: int = 0
    last_error: str | None = None


class _NoVerdict(ValueError):
    """A reply without a verdict: deterministic at temperature 0, so never retried."""


def _retryable(err: Exception) -> bool:
    if isinstance(err, _NoVerdict):
        return False
    if isinstance(err, urllib.error.HTTPError):
        return err.code >= 500 or err.code == 429
    return True


def parse_verdict(reply: str) -> float | None:
    """1.0 / 0.5 / 0.0 from a judge reply, or None when it holds no verdict."""
    word = _VERDICT_RE.search(reply)
    if word is not None:
        return _VERDICT_SCORES[word.group(1).lower().split()[0]]
    number = _NUMBER_RE.search(reply)
    if number is None:
        return None
    value = float(number.group(1))
    if not 0.0 <= value <= 1.0:
        return None
    return min((0.0, 0.5, 1.0), key=lambda level: abs(level - value))


class LLMJudge:
    """Scores (prediction, gold) with a chat model; token F1 when the endpoint fails."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_tokens: int = 8,
        max_workers: int = 8,
        retries: int = 2,
        backoff: float = 0.5,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        """`extra_body`: more JSON fields for each request, e.g. vLLM's
        `{"structured_outputs": {"choice": ["CORRECT", "PARTIAL", "INCORRECT"]}}`."""
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"LLMJudge base_url {base_url!r} must start with http:// or https:// "
                "(e.g. http://127.0.0.1:8000/v1)"
            )
        if timeout <= 0:
            raise ValueError(f"LLMJudge timeout must be > 0 seconds, got {timeout}")
        if max_workers < 1 or retries < 0 or backoff < 0:
            raise ValueError(
                f"LLMJudge needs max_workers >= 1, retries >= 0, backoff >= 0; got "
                f"{max_workers}, {retries}, {backoff}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.max_workers, self.retries, self.backoff = max_workers, retries, backoff
        self.extra_body = dict(extra_body or {})
        self.num_calls = 0
        self.num_fallbacks = 0
        self.last_error: str | None = None
        self._step = JudgeStats()
        self._cache: dict[tuple[str, str], float | None] = {}  # None: fell back
        # Rewards may be computed from several threads; the counters must stay exact.
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/chat/completions"

    def __call__(self, prediction: str, gold: str, question: str = "") -> float:
        """The judge's score, or token F1 when it failed (counted as a fallback)."""
        verdict = self.verdict(prediction, gold, question)
        return verdict if verdict is not None else token_f1(prediction, gold)

    def verdict(self, prediction: str, gold: str, question: str = "") -> float | None:
        """The judge's 1 / 0.5 / 0 (from the step's cache when prefetched), or None when the
        request failed after its retries (counted as a fallback): the caller picks the fallback."""
        with self._lock:
            if (prediction, gold) in self._cache:
                return self._cache[(prediction, gold)]
        return self._verdict(prediction, gold, question)

    def prefetch(self, items: Sequence[tuple[str, str, str]]) -> None:
        """Score (prediction, gold, question) items concurrently into the step's cache."""
        todo = list({(p, g): (p, g, q) for p, g, q in items if (p, g) not in self._cache}.values())
        if not todo:
            return
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(todo))) as pool:
            scores = list(pool.map(lambda item: self._verdict(*item), todo))
        with self._lock:
            self._cache.update({(p, g): v for (p, g, _), v in zip(todo, scores, strict=True)})

    def take_stats(self) -> JudgeStats:
        """Calls and fallbacks since the last take (the step's), and a fresh cache."""
        with self._lock:
            stats, self._step = self._step, JudgeStats(last_error=self._step.last_error)
            self._cache.clear()
        return stats

    def _verdict(self, prediction: str, gold: str, question: str) -> float | None:
        with self._lock:
            self.num_calls += 1
            self._step = JudgeStats(self._step.calls + 1, self._step.fallbacks, self.last_error)
        try:
            return self._ask_with_retries(prediction, gold, question)
        except _JUDGE_ERRORS as err:
            with self._lock:
                self.num_fallbacks += 1
                self.last_error = f"{type(err).__name__}: {err}"
                step = self._step
                self._step = JudgeStats(step.calls, step.fallbacks + 1, self.last_error)
            return None

    def _ask_with_retries(self, prediction: str, gold: str, question: str) -> float:
        for attempt in range(self.retries + 1):
            try:
                verdict = parse_verdict(self._ask(prediction, gold, question))
                if verdict is None:
                    raise _NoVerdict("judge reply holds no verdict")
                return verdict
            except _JUDGE_ERRORS as err:
                if attempt == self.retries or not _retryable(err):
                    raise
                time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _ask(self, prediction: str, gold: str, question: str) -> str:
        """The assistant message of one chat completion."""
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": JUDGE_USER_TEMPLATE.format(
                        question=question, gold=gold, prediction=prediction
                    ),
                },
            ],
            "temperature": 0,
            "max_tokens": self.max_tokens,
            **self.extra_body,
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.endpoint,
            data=json.dumps(body).encode("utf-8"),
            headers=headers,
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            reply: Any = json.loads(response.read().decode("utf-8"))
        content = reply["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError(f"judge reply content is {type(content).__name__}, not text")
        return content
