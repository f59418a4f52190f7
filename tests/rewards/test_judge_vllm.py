"""LLMJudge against vLLM's real OpenAI-compatible server on loopback, serving the tiny model
(`python -m vllm.entrypoints.openai.api_server`, in the vLLM environment: `make test` runs the
`vllm` tests there). A random tiny model cannot judge, so the verdict is constrained with vLLM's
structured outputs (`extra_body`); without it the model babbles and every answer falls back,
which the guard turns into an error naming the endpoint."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from paravt.rewards.judge import LLMJudge
from paravt.rewards.judge_guard import JudgeFailure, JudgeGuard
from paravt.types import Sample, Trajectory, Turn

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]
CHOICE = {"structured_outputs": {"choice": ["CORRECT", "PARTIAL", "INCORRECT"]}}
START_TIMEOUT_S = 1200  # start-up took ~6 min on 2 shared cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def documented_server(model_dir, port: int) -> list[str]:
    """The judge server command the docs show (`python -m vllm.entrypoints.openai.api_server
    --model JUDGE_DIR ...`, on whichever page of docs/ holds it) as written, serving `model_dir`
    as JUDGE_DIR on `port`, plus what the tiny model on a shared CPU needs: loopback only, eager
    mode (no compilation), a short context and no media inputs."""
    command = r"^python -m vllm\.entrypoints\.openai\.api_server .*JUDGE_DIR.*$"
    pages = sorted((ROOT / "docs").glob("*.md"))
    found = [m for page in pages for m in re.finditer(command, page.read_text(), re.M)]
    assert found, "docs/ shows no `python -m vllm.entrypoints.openai.api_server` judge command"
    line = found[0]
    argv = [str(model_dir) if a == "JUDGE_DIR" else a for a in shlex.split(line.group(0))]
    argv[argv.index("--port") + 1] = str(port)
    cpu = ["--host", "127.0.0.1", "--max-model-len", "1024", "--enforce-eager"]
    return [sys.executable, *argv[1:], *cpu, "--limit-mm-per-prompt", '{"video": 0, "image": 0}']


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory) -> Iterator[str]:
    port = _free_port()
    log = (tmp_path_factory.mktemp("vllm_judge") / "server.log").open("w")
    env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.Popen(
        documented_server(tiny_qwen3_dir, port),
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail(f"vLLM server not up after {START_TIMEOUT_S} s; see {log.name}")
            time.sleep(2)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_answers_are_scored_concurrently_through_the_server(server):
    judge = LLMJudge(server, model="judge", timeout=120, max_workers=4, extra_body=CHOICE)
    colours = ("red", "blue", "green", "dark red", "crimson", "yellow", "pink", "orange")
    items = [(f"a {c} square", "red", "What colour is the square?") for c in colours]
    judge.prefetch(items)
    scores = [judge(p, g, q) for p, g, q in items]
    stats = judge.take_stats()
    assert (stats.calls, stats.fallbacks) == (8, 0), stats.last_error
    assert set(scores) <= {0.0, 0.5, 1.0}
    guard = JudgeGuard()
    assert (
        guard.update(stats.calls, stats.fallbacks, judge.endpoint, None)["judge/fallback_rate"]
        == 0.0
    )


def test_a_judge_that_gives_no_verdict_stops_training(server):
    # The tiny model unconstrained: its reply holds no verdict word (not retried).
    judge = LLMJudge(server, model="judge", timeout=120, max_tokens=4)
    judge.prefetch([("a blue square", "red", "What colour?"), ("green", "red", "Colour?")])
    stats = judge.take_stats()
    assert stats.calls == 2 and stats.fallbacks >= 1
    with pytest.raises(JudgeFailure) as err:
        JudgeGuard().update(stats.calls, stats.fallbacks, judge.endpoint, stats.last_error)
    assert f"{server}/chat/completions" in str(err.value) and "no verdict" in str(err.value)


def test_an_unknown_model_name_is_a_client_error_not_retried(server):
    judge = LLMJudge(server, model="no-such-model", timeout=60, retries=3, backoff=5.0)
    started = time.monotonic()
    assert judge("red", "red car") == pytest.approx(2 / 3)  # token F1 fallback
    assert time.monotonic() - started < 5.0  # a 404 is not retried with backoff
    assert "404" in judge.last_error


def _answer(sample: Sample, text: str) -> Trajectory:
    turn = Turn(text=f"<think>I looked.</think><answer>{text}</answer>")
    return Trajectory(sample.id, 0, (), (), (), (), 0, turns=(turn,))


def test_the_judge_group_as_train_py_builds_it_scores_a_step(server):
    """`judge=openai` composed as train.py composes it (pointed at the server, structured
    outputs passed through `judge.client.extra_body` on the command line), built by train.py's
    glue, judging one step's rewards: multiple-choice answers and exact matches never reach
    the server, each other open-ended answer is judged there without a fallback."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from paravt.rewards.judged import judged_rewards
    from paravt.run.build import _judge

    choice = "{structured_outputs:{choice:[CORRECT,PARTIAL,INCORRECT]}}"
    overrides = ["judge=openai", f"judge.client.base_url='{server}'", "judge.client.model=judge"]
    overrides += [f"judge.client.extra_body={choice}", "judge.client.timeout=120"]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    built = _judge(cfg)
    judge, guard = built["judge"], built["judge_guard"]
    assert judge.endpoint == f"{server}/chat/completions" and judge.extra_body == CHOICE
    q = "What colour is the square?"
    samples = [
        Sample("oe1", "", q, "red", "oe"),
        Sample("oe2", "", q, "red", "oe"),
        Sample("exact", "", q, "red", "oe"),
        Sample("mcq", "", f"{q} A. red B. blue", "A", "mcq", options=("red", "blue")),
    ]
    answers = ["a crimson square", "blue", "red", "B"]
    trajs = [_answer(s, a) for s, a in zip(samples, answers, strict=True)]
    rewards, metrics = judged_rewards(trajs, samples, instantiate(cfg.reward), judge, guard)
    assert (metrics["judge/calls"], metrics["judge/fallbacks"]) == (2, 0), judge.last_error
    assert rewards[0].accuracy in {0.0, 0.5, 1.0} and rewards[1].accuracy in {0.0, 0.5, 1.0}
    assert (rewards[2].accuracy, rewards[3].accuracy) == (1.0, 0.0)  # not asked
