"""Open-ended answers of an evaluation through a real judge server on loopback.

A standard-library HTTP server answers each request by the reference answer it carries: a
verdict for some, HTTP 500 or a verdict-less reply for others. The scores and the counts in
metrics.json and the printed summary must equal what the server saw; without a judge the
open-ended rows are scored by the benchmark's own rule and the results say so.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from paravt.eval.adapters import get_benchmark
from paravt.eval.adapters.mmvu_open import rule_correct
from paravt.eval.judging import judge_report, score_batch
from paravt.eval.runner import METRICS, PREDICTIONS
from paravt.rewards.accuracy import extract_answer, token_f1
from paravt.rewards.judge import LLMJudge
from tests import forkserver
from tests.loopback import send, serve

ROOT = Path(__file__).resolve().parents[2]
# Reference answer -> the server's reply: a verdict word, or an HTTP status to fail with.
BEHAVIOUR = {"g0": "CORRECT", "g1": 500, "g2": "INCORRECT", "g3": 503, "g4": "PARTIAL", "g5": "?"}
SEEN: list[tuple[str, str]] = []  # (candidate, reference) of every request, retries included
_lock = threading.Lock()


class _Judge(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        user = payload["messages"][1]["content"]
        gold = user.split("Reference answer: ", 1)[1].split("\nCandidate answer: ", 1)[0]
        candidate = user.split("\nCandidate answer: ", 1)[1].rsplit("\nVerdict:", 1)[0]
        with _lock:
            SEEN.append((candidate, gold))
        reply = BEHAVIOUR.get(gold, "CORRECT")
        if isinstance(reply, int):
            send(self, reply, b'{"error": "judge overloaded"}')
        else:
            send(self, 200, json.dumps({"choices": [{"message": {"content": reply}}]}).encode())


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    with serve(_Judge) as url:
        yield f"{url}/v1"


# ------------------------------------------------------------------ MMVU's open-ended part

URL = "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/{subject}/{n}.mp4"


def _mmvu_row(i: int, qtype: str, answer: str, subject: str = "Computer_Science") -> dict:
    """A row of MMVU's data/validation.json (open-ended rows carry empty choices)."""
    choices = {"A": "x", "B": "y", "C": "z", "D": "w", "E": ""} if qtype != "open-ended" else {}
    return {
        "id": f"validation_{i}",
        "video": URL.format(subject=subject, n=i),
        "youtube_url": "https://youtube.com/x",
        "question_type": qtype,
        "metadata": {"subject": subject, "textbook": "t", "knowledge": "k", "rationale": "r"},
        "question": f"Question {i}?",
        "choices": choices,
        "answer": answer,
    }


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("Depth-First Search (DFS)", "depth-first search (dfs)", True),  # case
        ("The algorithm is depth-first search.", "Depth-first search", True),  # gold inside
        ("DFS", "Depth-first search (DFS)", True),  # answer inside the gold
        ("about 9.81 m/s^2", "9.815", True),  # first numbers within 0.01
        ("9.7", "9.83", False),
        ("9.8", "9.83", True),  # contained in the gold: the protocol's rule is that lenient
        ("mitochondria of the cell", "cell mitochondria", True),  # 2-5 gold words all present
        ("It runs in O(n²) time", "quadratic, O(n^2)", True),  # superscripts, O(...)
        ("linear", "logarithmic", False),
        ("", "logarithmic", False),  # an empty answer is never "inside" the gold
    ],
)
def test_mmvu_open_ended_rules(answer, gold, expected):
    assert rule_correct(answer, gold) is expected


def test_mmvu_oe_keeps_the_open_ended_rows_mmvu_leaves_out(write_json, touch, tmp_path):
    rows = [_mmvu_row(0, "multiple-choice", "B"), _mmvu_row(1, "open-ended", "O(n log n)")]
    rows.append(_mmvu_row(2, "open-ended", "Heap", subject="Art"))
    path, root = write_json(rows), str(tmp_path / "mmvu")
    touch("mmvu/videos/Computer_Science/1.mp4")
    open_items = get_benchmark("mmvu_oe").load(path, root)
    assert [i.sample.id for i in open_items] == ["validation_1", "validation_2"]
    assert [i.sample.id for i in get_benchmark("mmvu").load(path, root)] == ["validation_0"]
    first = open_items[0]
    assert first.sample.question_type == "oe" and first.sample.answer == "O(n log n)"
    assert first.sample.question.startswith("Question: Question 1?\n")
    assert first.groups["discipline"] == ("Engineering",) and not first.video_missing
    assert open_items[1].video_missing and open_items[1].groups["discipline"] == (
        "Humanities & Social Science",
    )


def test_mmvu_oe_scored_by_rules_then_the_judge(write_json, touch, tmp_path, judge_url):
    """Rules first; the judge sees only what they call wrong; PARTIAL counts 0; a failed
    request keeps the rules' 0 and is counted; without a judge nothing is asked."""
    golds = ["g0", "g1", "g2", "g4", "g5", "exact gold"]
    rows = [_mmvu_row(i, "open-ended", g) for i, g in enumerate(golds)]
    for i in range(len(rows)):
        touch(f"mmvu/videos/Computer_Science/{i}.mp4")
    bench = get_benchmark("mmvu_oe")
    items = bench.load(write_json(rows), str(tmp_path / "mmvu"))
    words = ["alpha", "bravo", "charlie", "delta", "echo"]  # no digit: the number rule stays out
    responses = [f"<think>x</think><answer>guess {w}</answer>" for w in words]
    responses.append("<answer>the exact gold</answer>")  # the rules already say correct
    assert [s["correct"] for s in score_batch(bench, items, responses)] == [0, 0, 0, 0, 0, 1]
    SEEN.clear()
    judge = LLMJudge(judge_url, model="judge", retries=1, backoff=0.01, max_workers=3)
    scores = score_batch(bench, items, responses, judge)
    assert [s["correct"] for s in scores] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert [s.get("judged", 0.0) for s in scores] == [1, 0, 1, 1, 0, 0]
    assert [s.get("judge_fallback", 0.0) for s in scores] == [0, 1, 0, 0, 1, 0]
    # g1 (HTTP 500) was retried once; g5 (no verdict) was not; the exact answer was never sent.
    assert sorted(SEEN) == sorted(
        [(f"guess {w}", g) for w, g in zip(words, golds, strict=False)] + [("guess bravo", "g1")]
    )
    report = judge_report(bench, items, scores, judge)
    assert (report["scored"], report["fell_back"], report["open_ended"]) == (3, 2, 6)
    assert report["share"] == pytest.approx(2 / 5) and report["fallback"] == "MMVU's rules"
    assert report["endpoint"] == f"{judge_url}/chat/completions" and report["last_failure"]


def test_a_multiple_choice_benchmark_without_judge_reports_nothing_new(write_json, tmp_path):
    bench = get_benchmark("mmvu")
    items = bench.load(write_json([_mmvu_row(0, "multiple-choice", "B")]), str(tmp_path))
    scores = score_batch(bench, items, ["<answer>B</answer>"])
    assert scores == [bench.score(items[0], "<answer>B</answer>")]
    assert judge_report(bench, items, scores, None) is None


# ------------------------------------------------------------------ evaluate.py end to end


@pytest.fixture(scope="module")
def open_ended_eval(needle_dir, tmp_path_factory) -> Path:
    """The needle rows as open-ended questions with references g0..g5 (the server's keys);
    the grounding rows stay grounding rows (a mixed split)."""
    out = tmp_path_factory.mktemp("oe_eval")
    rows, k = [], 0
    for name in ("eval.jsonl", "train.jsonl"):
        for line in (needle_dir / name).read_text().splitlines():
            row = json.loads(line)
            info = row["extra_info"]
            row["videos"] = [{"video": str(needle_dir / v["video"])} for v in row["videos"]]
            info["id"] = f"oe-{len(rows)}"
            if info["question_type"] == "mcq":
                info["answer"], info["question_type"], info["options"] = f"g{k}", "oe", []
                k += 1
            rows.append(json.dumps(row))
    (out / "eval.jsonl").write_text("\n".join(rows) + "\n")
    assert k >= 3, "the fixture split needs open-ended rows"
    return out / "eval.jsonl"


def _evaluate(model_dir: Path, data: Path, out_dir: Path, *extra: str):
    overrides = [
        "benchmark=needle", f"model.path={model_dir}", "model.build_tiny=null",
        f"benchmark.annotations={data}", f"out_dir={out_dir}", f"hydra.run.dir={out_dir}_hydra",
        "device=cpu", "protocol.frame_budget=4", "rollout.agent.max_rounds=1",
        "rollout.agent.max_new_tokens=12", "protocol.batch_size=4", *extra,
    ]  # fmt: skip
    logs = out_dir.parent / f"{out_dir.name}_logs"  # a fork of its own (tests/forkserver.py)
    return forkserver.run([str(ROOT / "evaluate.py"), *overrides], logs, ROOT, timeout=900)


def _records(out_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (out_dir / PREDICTIONS).read_text().splitlines()]


@pytest.mark.slow
def test_evaluate_judges_open_ended_rows_and_counts_what_the_server_saw(
    tiny_qwen3_dir, open_ended_eval, judge_url, tmp_path
):
    SEEN.clear()
    out_dir = tmp_path / "judged"
    judge = [
        "judge=openai", f"judge.client.base_url={judge_url}", "judge.client.model=judge",
        "judge.client.retries=1", "judge.client.backoff=0.01",
    ]  # fmt: skip
    run = _evaluate(tiny_qwen3_dir, open_ended_eval, out_dir, *judge)
    assert run.returncode == 0, run.stderr[-3000:]
    records = _records(out_dir)
    payload = json.loads((out_dir / METRICS).read_text())
    report, metrics = payload["judge"], payload["metrics"]
    asked = {
        (extract_answer(r["answer"]), r["gold"])
        for r in records
        if r["score"].get("judged") or r["score"].get("judge_fallback")
    }
    assert asked == set(SEEN)  # the server saw exactly the answers counted as asked
    for r in records:
        verdict = BEHAVIOUR.get(r["gold"])
        answer = extract_answer(r["answer"])
        if r["score"].get("judged"):
            assert isinstance(verdict, str) and verdict != "?"
            expected = {"CORRECT": 1.0, "PARTIAL": 0.5, "INCORRECT": 0.0}[verdict]
            assert r["score"]["accuracy"] == expected
        elif r["score"].get("judge_fallback"):  # 5xx after a retry, or no verdict: token F1
            assert verdict in (500, 503, "?")
            assert r["score"]["accuracy"] == pytest.approx(token_f1(answer, r["gold"]))
            if verdict != "?":
                assert SEEN.count((answer, r["gold"])) == 2  # the first try and one retry
    scored = sum(bool(r["score"].get("judged")) for r in records)
    fell_back = sum(bool(r["score"].get("judge_fallback")) for r in records)
    assert fell_back >= 1 and scored >= 1, "the tiny model's answers should reach the judge"
    assert (report["scored"], report["fell_back"]) == (scored, fell_back)
    assert metrics["judge_scored"] == scored and metrics["judge_fallbacks"] == fell_back
    open_ended = sum(r["gold"].startswith("g") for r in records)
    assert report["open_ended"] == metrics["open_ended"] == open_ended
    assert report["endpoint"] == f"{judge_url}/chat/completions"
    line = (
        f"judge: {scored} answers scored by the judge, {fell_back} fell back to token F1 "
        f"(share {fell_back / (scored + fell_back):.2f}"
    )
    assert line in run.stdout
    logged = run.stdout + run.stderr  # the warning, wherever the logging config sends it
    assert f"LLM judge at {judge_url}/chat/completions: {fell_back} of" in logged
    assert "last failure: HTTPError: HTTP Error 50" in logged or "holds no verdict" in logged
    assert line in (out_dir / "results.md").read_text()

    # The same run resumed with a zero tolerance: nothing is re-run or re-asked, the counts
    # come from predictions.jsonl, and the run fails (exit 2) after writing its results.
    before = len(SEEN)
    again = _evaluate(
        tiny_qwen3_dir, open_ended_eval, out_dir, *judge, "judge_max_fallback_share=0.0"
    )
    assert again.returncode == 2, again.stderr[-3000:]
    assert len(SEEN) == before and line in again.stdout
    assert "judge_max_fallback_share 0.0" in again.stderr
    assert f"{judge_url}/chat/completions" in again.stderr.splitlines()[-1]


@pytest.mark.slow
def test_evaluate_without_a_judge_says_the_answers_were_not_judged(
    tiny_qwen3_dir, open_ended_eval, tmp_path
):
    SEEN.clear()
    out_dir = tmp_path / "plain"
    run = _evaluate(tiny_qwen3_dir, open_ended_eval, out_dir)
    assert run.returncode == 0, run.stderr[-3000:]
    records = _records(out_dir)
    payload = json.loads((out_dir / METRICS).read_text())
    open_ended = [r for r in records if r["gold"].startswith("g")]
    for r in open_ended:  # the training reward's default open-ended score: token F1
        assert r["score"] == {
            "accuracy": pytest.approx(token_f1(extract_answer(r["answer"]), r["gold"]))
        }
    assert payload["judge"]["endpoint"] is None and payload["judge"]["scored"] == 0
    assert payload["judge"]["open_ended"] == len(open_ended)
    assert "judge_scored" not in payload["metrics"] and not SEEN
    assert "judge" not in payload["run"]  # the run identity is the one of a judge-less run
    expected = f"judge: none configured; {len(open_ended)} open-ended answer(s) scored by token F1"
    assert f"{expected}, not judged" in run.stdout


def test_a_bad_fallback_tolerance_is_refused_before_anything_runs():
    from hydra import compose, initialize_config_dir

    from evaluate import build_judge

    overrides = ["judge=openai", "judge_max_fallback_share=1.5"]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("eval", overrides=overrides)
    with pytest.raises(ValueError, match=r"judge_max_fallback_share must be in \[0, 1\].*1\.5"):
        build_judge(cfg)
    cfg.judge_max_fallback_share = 0.25
    judge = build_judge(cfg)
    assert isinstance(judge, LLMJudge) and judge.endpoint.endswith("/v1/chat/completions")
