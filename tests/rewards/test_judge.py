"""LLMJudge against a real OpenAI-like HTTP server on 127.0.0.1."""

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest

from paravt.rewards.accuracy import accuracy_reward
from paravt.rewards.judge import LLMJudge, parse_verdict
from tests.loopback import send, serve

CONF = Path(__file__).resolve().parents[2] / "conf"

# Path prefix -> what the server does; the judge's base_url picks the behaviour.
REPLIES = {
    "/correct": "CORRECT",
    "/partial": "Verdict: partial",
    "/incorrect": "INCORRECT - the colours differ",
    "/number": "0.4",
    "/babble": "I cannot tell.",
}


class _Handler(BaseHTTPRequestHandler):
    requests: ClassVar[list[tuple[str, dict, dict]]] = []
    times: ClassVar[dict[str, list[float]]] = {}  # path -> arrival times
    in_flight: ClassVar[list[int]] = [0, 0]  # now, most at once
    gauge = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: bytes) -> None:
        send(self, status, body)

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        payload = json.loads(self.rfile.read(length))
        _Handler.requests.append((self.path, dict(self.headers), payload))
        _Handler.times.setdefault(self.path, []).append(time.monotonic())
        prefix = "/" + self.path.strip("/").split("/")[0]
        self._reply(prefix, payload)

    @staticmethod
    def _work(seconds: float) -> None:
        """A request counts as in flight while the server works on it, and stops counting
        before its reply is written: once the client has a reply it may send the next request,
        and that one must not overlap the previous one's bookkeeping (a false 4th in flight)."""
        with _Handler.gauge:
            _Handler.in_flight[0] += 1
            _Handler.in_flight[1] = max(_Handler.in_flight)
        try:
            time.sleep(seconds)
        finally:
            with _Handler.gauge:
                _Handler.in_flight[0] -= 1

    def _reply(self, prefix: str, payload: dict) -> None:
        if prefix == "/slow":  # far past the client's timeout, so waiting it out is unmistakable
            time.sleep(2.0)
        if prefix == "/busy":  # a slow but working judge: the pool's bound is visible
            self._work(0.3)
        if prefix.startswith("/flaky") and len(_Handler.times[self.path]) <= 2:
            self._send(503, b'{"error": "warming up"}')
            return
        if prefix == "/bad":
            self._send(400, b'{"error": "bad request"}')
            return
        if prefix == "/truncated":
            self._send(200, b'{"choices": [{"message": {"content": "COR')
            return
        if prefix == "/nochoices":
            self._send(200, b'{"choices": []}')
            return
        if prefix == "/nullcontent":
            self._send(200, b'{"choices": [{"message": {"role": "assistant", "content": null}}]}')
            return
        if prefix == "/error":
            self._send(500, b'{"error": "boom"}')
            return
        if prefix == "/notjson":
            self._send(200, b"<html>hello</html>")
            return
        content = REPLIES.get(prefix, "CORRECT")
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
        self._send(200, json.dumps(reply).encode())


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with serve(_Handler) as url:
        yield url


def test_request_is_an_openai_chat_completion(server_url: str) -> None:
    _Handler.requests.clear()
    judge = LLMJudge(f"{server_url}/correct/v1/", model="judge-model", api_key="k-123")
    assert judge("crimson", "red", question="What colour?") == 1.0
    path, headers, payload = _Handler.requests[-1]
    assert path == "/correct/v1/chat/completions"  # trailing slash of base_url dropped
    assert headers["Authorization"] == "Bearer k-123"
    assert payload["model"] == "judge-model"
    assert payload["temperature"] == 0
    assert [m["role"] for m in payload["messages"]] == ["system", "user"]
    user = payload["messages"][1]["content"]
    assert "What colour?" in user and "crimson" in user and "red" in user
    assert (judge.num_calls, judge.num_fallbacks) == (1, 0)


def test_the_judge_group_sends_extra_body_given_on_the_command_line(server_url: str) -> None:
    """`judge=openai judge.client.extra_body={...}` as train.py and evaluate.py build it: the
    fields reach the request (Hydra's DictConfig is not JSON: every answer fell back before)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    overrides = ["judge=openai", f"judge.client.base_url='{server_url}/correct/v1'"]
    overrides.append("judge.client.extra_body={structured_outputs:{choice:[CORRECT,INCORRECT]}}")
    with initialize_config_dir(str(CONF), version_base="1.3"):
        judge = instantiate(compose("train", overrides=overrides).judge.client)  # as build.py
    assert judge("crimson", "red") == 1.0, judge.last_error
    payload = _Handler.requests[-1][2]
    assert payload["structured_outputs"] == {"choice": ["CORRECT", "INCORRECT"]}
    assert judge.num_fallbacks == 0


def test_no_api_key_sends_no_authorization(server_url: str) -> None:
    _Handler.requests.clear()
    LLMJudge(f"{server_url}/correct/v1", model="m")("a", "b")
    assert "Authorization" not in _Handler.requests[-1][1]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [("/correct", 1.0), ("/partial", 0.5), ("/incorrect", 0.0), ("/number", 0.5)],
)
def test_verdicts(server_url: str, prefix: str, expected: float) -> None:
    # "/number" replies 0.4, snapped to the nearest level 0.5.
    judge = LLMJudge(f"{server_url}{prefix}/v1", model="m")
    assert judge("crimson", "red") == expected
    assert judge.num_fallbacks == 0


@pytest.mark.parametrize("prefix", ["/slow", "/error", "/notjson", "/babble"])
def test_failures_fall_back_to_token_f1_and_are_counted(server_url: str, prefix: str) -> None:
    judge = LLMJudge(f"{server_url}{prefix}/v1", model="m", timeout=0.2, retries=0)
    started = time.monotonic()
    # pred {red, car, parked} vs gold {red, car}: P = 2/3, R = 1, F1 = 0.8
    assert judge("a red car parked", "the red car") == pytest.approx(0.8)
    assert time.monotonic() - started < 1.5  # the slow endpoint was abandoned at the 0.2 s timeout
    assert (judge.num_calls, judge.num_fallbacks) == (1, 1)
    assert judge.last_error


def test_http_500_reports_the_error(server_url: str) -> None:
    judge = LLMJudge(f"{server_url}/error/v1", model="m")
    judge("x", "y")
    assert "500" in judge.last_error


def test_unreachable_endpoint_falls_back() -> None:
    # Port 9 on 127.0.0.1 has no listener here: connection refused.
    judge = LLMJudge("http://127.0.0.1:9/v1", model="m", timeout=0.2)
    assert judge("red", "red car") == pytest.approx(2 / 3)  # P = 1, R = 1/2 -> F1 = 2/3
    assert judge.num_fallbacks == 1


def test_judge_plugs_into_accuracy_reward(server_url: str) -> None:
    judge = LLMJudge(f"{server_url}/partial/v1", model="m")
    assert accuracy_reward("crimson", "red", "oe", open_ended="judge", judge=judge) == 0.5


def test_counters_are_exact_across_threads(server_url: str) -> None:
    judge = LLMJudge(f"{server_url}/error/v1", model="m")
    threads = [threading.Thread(target=judge, args=("x", "y")) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (judge.num_calls, judge.num_fallbacks) == (8, 8)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("CORRECT", 1.0),
        ("incorrect.", 0.0),  # INCORRECT is not read as CORRECT
        ("Partially correct", 0.5),  # not read as CORRECT
        ("The answer is not correct", 0.0),
        ("1", 1.0),
        ("0.5", 0.5),
        ("0.2", 0.0),
        ("score 0.8", 1.0),
        ("7", None),
        ("", None),
        ("no idea", None),
    ],
)
def test_parse_verdict(reply: str, expected: float | None) -> None:
    assert parse_verdict(reply) == expected


def test_bad_configuration_is_named() -> None:
    with pytest.raises(ValueError, match="must start with http"):
        LLMJudge("127.0.0.1:8000/v1", model="m")
    with pytest.raises(ValueError, match="timeout must be > 0"):
        LLMJudge("http://127.0.0.1:8000/v1", model="m", timeout=0)


def test_a_flaky_server_is_retried_with_exponential_backoff(server_url: str) -> None:
    # /flaky answers 503 to the first two requests of a path, then CORRECT.
    judge = LLMJudge(f"{server_url}/flaky1/v1", model="m", retries=2, backoff=0.1)
    assert judge("crimson", "red") == 1.0
    assert (judge.num_calls, judge.num_fallbacks) == (1, 0)
    t = _Handler.times["/flaky1/v1/chat/completions"]
    assert len(t) == 3
    assert t[1] - t[0] >= 0.1 and t[2] - t[1] >= 0.2  # backoff 0.1 s, then 0.2 s


def test_retries_run_out_then_fall_back(server_url: str) -> None:
    judge = LLMJudge(f"{server_url}/flaky2/v1", model="m", retries=1, backoff=0.01)
    assert judge("a red car parked", "the red car") == pytest.approx(0.8)  # token F1
    assert len(_Handler.times["/flaky2/v1/chat/completions"]) == 2
    assert "503" in judge.last_error


@pytest.mark.parametrize(("prefix", "requests"), [("/bad", 1), ("/babble", 1), ("/error", 3)])
def test_client_errors_and_verdictless_replies_are_not_retried(server_url, prefix, requests):
    path = f"{prefix}/v1/chat/completions"
    before = len(_Handler.times.get(path, []))
    judge = LLMJudge(f"{server_url}{prefix}/v1", model="m", retries=2, backoff=0.01)
    judge("x", "y")
    assert len(_Handler.times[path]) - before == requests  # 500 is retried twice, 400 never
    assert judge.num_fallbacks == 1


@pytest.mark.parametrize("prefix", ["/truncated", "/nochoices", "/nullcontent", "/notjson"])
def test_malformed_bodies_fall_back_with_the_reason(server_url: str, prefix: str) -> None:
    judge = LLMJudge(f"{server_url}{prefix}/v1", model="m", retries=0)
    assert judge("red", "red car") == pytest.approx(2 / 3)
    assert judge.num_fallbacks == 1 and judge.last_error.split(":")[0] in {
        "JSONDecodeError", "IndexError", "TypeError",
    }  # fmt: skip


def test_prefetch_is_concurrent_bounded_and_cached(server_url: str) -> None:
    judge = LLMJudge(f"{server_url}/busy/v1", model="m", max_workers=3)
    items = [(f"answer {i}", "gold", "q?") for i in range(9)] + [("answer 0", "gold", "q?")]
    _Handler.in_flight[1] = 0
    before = len(_Handler.times.get("/busy/v1/chat/completions", []))
    started = time.monotonic()
    judge.prefetch(items)
    elapsed = time.monotonic() - started
    assert _Handler.in_flight[1] == 3  # never more than max_workers at once
    assert len(_Handler.times["/busy/v1/chat/completions"]) - before == 9  # duplicate asked once
    assert 0.85 <= elapsed < 2.5  # 9 requests of 0.3 s, 3 at a time: 3 rounds, not 9
    assert judge("answer 4", "gold") == 1.0  # from the cache: no new request
    assert len(_Handler.times["/busy/v1/chat/completions"]) - before == 9
    stats = judge.take_stats()
    assert (stats.calls, stats.fallbacks) == (9, 0)
    assert judge.take_stats().calls == 0  # counts and cache are per step


def test_bad_pool_settings_are_named() -> None:
    with pytest.raises(ValueError, match="max_workers >= 1, retries >= 0"):
        LLMJudge("http://127.0.0.1:8000/v1", model="m", max_workers=0)
