"""RL steps with `judge=openai` against a real HTTP server on loopback (the standard library's):
open-ended answers are judged, the counts are logged, and a failing judge stops the run with an
error naming the endpoint and the last failure."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from paravt.rewards.judge_guard import JudgeFailure
from paravt.run.build import build_run
from tests.loopback import send, serve

ROOT = Path(__file__).resolve().parents[2]
SEEN: list[dict] = []


class _Judge(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        SEEN.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        if self.path.startswith("/down"):
            send(self, 500, b'{"error": "model not loaded"}')
        else:
            reply = {"choices": [{"message": {"role": "assistant", "content": "CORRECT"}}]}
            send(self, 200, json.dumps(reply).encode())


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    with serve(_Judge) as url:
        yield url


@pytest.fixture(scope="module")
def open_ended_data(needle_dir, tmp_path_factory) -> Path:
    """The needle rows as open-ended questions: the gold is the option's text, not its letter."""
    out = tmp_path_factory.mktemp("oe")
    rows = []
    for line in (needle_dir / "train.jsonl").read_text().splitlines():
        row = json.loads(line)
        info = row["extra_info"]
        if info["question_type"] != "mcq":  # grounding rows: an interval, not a phrase
            continue
        info["answer"] = info["options"][ord(info["answer"]) - ord("A")]
        info["question_type"], info["options"] = "oe", []
        row["videos"] = [{"video": str(needle_dir / v["video"])} for v in row["videos"]]
        rows.append(json.dumps(row))
    (out / "train.jsonl").write_text("\n".join(rows) + "\n")
    return out / "train.jsonl"


def _run(tmp_path, tiny_run_overrides, needle_dir, data, url, *extra):
    overrides = [
        *tiny_run_overrides, f"run_dir={tmp_path}", f"data.train_path={data}",
        "cold_start=null", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
        "rollout.agent.max_new_tokens=12", "rollout.agent.max_rounds=1",
        "callbacks.benchmark_validation=null", "callbacks.rollout_logger=null",
        "judge=openai", f"judge.client.base_url={url}/v1", "judge.client.backoff=0.01", *extra,
    ]  # fmt: skip
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    run = build_run(cfg)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    return run


@pytest.mark.slow
def test_open_ended_answers_are_judged_and_counted(
    tmp_path, tiny_run_overrides, needle_dir, open_ended_data, judge_url
):
    SEEN.clear()
    run = _run(tmp_path, tiny_run_overrides, needle_dir, open_ended_data, judge_url)
    logged = run.trainer.callback_metrics
    calls = float(logged["judge/calls"])  # the last step's
    assert calls >= 1 and float(logged["judge/fallback_rate"]) == 0.0
    assert len(SEEN) >= calls and SEEN[-1]["messages"][1]["content"].startswith("Question: ")
    # The judge says CORRECT: every judged answer has accuracy 1.
    record = run.module.last_rollout
    judged = [r for t, r in zip(record.trajectories, record.rewards, strict=True) if r.accuracy]
    assert judged and all(r.accuracy == 1.0 for r in judged)


@pytest.mark.slow
def test_a_failing_judge_stops_training_naming_endpoint_and_failure(
    tmp_path, tiny_run_overrides, needle_dir, open_ended_data, judge_url
):
    with pytest.raises(JudgeFailure) as err:
        _run(tmp_path, tiny_run_overrides, needle_dir, open_ended_data, f"{judge_url}/down")
    text = str(err.value)
    assert f"{judge_url}/down/v1/chat/completions" in text
    assert "HTTP Error 500" in text and "fell back to token F1" in text
