"""An LLM judge for open-ended answers through any OpenAI-compatible chat endpoint.

`LLMJudge(prediction, gold, question="")` POSTs `{base_url}/chat/completions` with a JSON body
`{"model", "messages", "temperature": 0, "max_tokens"}` (and `Authorization: Bearer <api_key>`
when a key is given), using only the standard library, and maps the reply to 1 / 0.5 / 0.

The prompt (JUDGE_SYSTEM_PROMPT + JUDGE_USER_TEMPLATE below) asks for exactly one word:
CORRECT (1.0), PARTIAL (0.5) or INCORRECT (0.0). A bare number in [0, 1] is accepted too and
snapped to the nearest of 0 / 0.5 / 1. On any failure (timeout, connection or HTTP error, a body
that is not an OpenAI reply, an unparsable verdict) the judge falls back to token F1 and counts
it in `num_fallbacks` (with the reason in `last_error`), so training never stops on a flaky judge.

This module deliberately does no retries, batching or caching, and holds no credentials itself:
the caller passes `api_key` (e.g. from an environment variable read by the glue).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import urllib.error
import urllib.request
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
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"LLMJudge base_url {base_url!r} must start with http:// or https:// "
                "(e.g. http://127.0.0.1:8000/v1)"
            )
        if timeout <= 0:
            raise ValueError(f"LLMJudge timeout must be > 0 seconds, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.num_calls = 0
        self.num_fallbacks = 0
        self.last_error: str | None = None
        # Rewards may be computed from several threads; the counters must stay exact.
        self._lock = threading.Lock()

    def __call__(self, prediction: str, gold: str, question: str = "") -> float:
        with self._lock:
            self.num_calls += 1
        try:
            verdict = parse_verdict(self._ask(prediction, gold, question))
            if verdict is None:
                raise ValueError("judge reply holds no verdict")
            return verdict
        except _JUDGE_ERRORS as err:
            with self._lock:
                self.num_fallbacks += 1
                self.last_error = f"{type(err).__name__}: {err}"
            return token_f1(prediction, gold)

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
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            f"{self.base_url}/chat/completions",
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
