"""The evaluation runner on the needle benchmark with a real tiny Qwen3-VL, real videos, real files.

The engine is the real `TransformersEngine`, wrapped only to count the requests it receives: with
`max_rounds=0` each item is exactly one request, so the count says which items were (re-)run.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace

import pytest

from paravt.agent.loop import AgentConfig
from paravt.agent.prompts import FORCED_ANSWER
from paravt.agent.render import ChatRenderer
from paravt.eval.adapters import get_benchmark
from paravt.eval.adapters.base import MCQ_FORCED_ANSWER, AnnotationError
from paravt.eval.needle import NeedleBenchmark
from paravt.eval.runner import (
    METRICS,
    PREDICTIONS,
    EvalConfig,
    build_agent_loop,
    format_metrics,
    make_benchmark,
    read_predictions,
    run_benchmark,
)
from paravt.models.loading import PolicySpec, load_policy
from paravt.rollout.engines.hf import TransformersEngine
from paravt.video.reader import VideoReader

FAST = EvalConfig(
    agent=AgentConfig(max_new_tokens=4, max_total_tokens=65536, max_rounds=0),
    frame_budget=4,
    batch_size=2,
)


class CountingEngine:
    """The real engine, plus the number of requests it was asked to continue."""

    def __init__(self, engine: TransformersEngine):
        self.engine = engine
        self.requests = 0

    def generate(self, requests, params):
        self.requests += len(requests)
        return self.engine.generate(requests, params)


@pytest.fixture(scope="module")
def needle4(tmp_path_factory):
    from paravt.video.synthetic import NeedleConfig, generate

    out = tmp_path_factory.mktemp("needle4")
    generate(NeedleConfig(num_train=0, num_eval=4, seed=5), out)
    return out


@pytest.fixture(scope="module")
def policy(tiny_qwen3_dir):
    model, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    return model.eval(), processor


@pytest.fixture
def make_loop(policy):
    model, processor = policy

    def make(cfg: EvalConfig = FAST, forced: str = FORCED_ANSWER):
        engine = CountingEngine(TransformersEngine(model, processor.tokenizer))
        loop = build_agent_loop(engine, ChatRenderer(processor), VideoReader(), cfg, forced)
        return loop, engine

    return make


def lines(path):
    return path.read_text().splitlines()


def test_end_to_end_writes_predictions_and_metrics(needle4, make_loop, tmp_path):
    bench = NeedleBenchmark()
    items = bench.load(str(needle4 / "eval.jsonl"), "")
    loop, engine = make_loop()
    metrics = run_benchmark(bench, items, loop, str(tmp_path), FAST)
    records = [json.loads(line) for line in lines(tmp_path / PREDICTIONS)]
    assert [r["id"] for r in records] == [f"needle-eval-{i:05d}" for i in range(4)]
    assert engine.requests == 4  # 4 items x 1 round
    for record, item in zip(records, items, strict=True):
        assert record["score"] == bench.score(item, record["answer"])
        assert record["answer"] in record["response"] and record["answer"].startswith("<think>")
        assert record["groups"]["question_type"] == [item.sample.question_type]
        assert record["num_calls"] == 0 and record["rounds"] == 0
    assert json.loads((tmp_path / METRICS).read_text())["metrics"] == metrics
    assert metrics["num_samples"] == 4 and metrics["missing_videos"] == 0
    mean = sum(r["score"]["accuracy"] for r in records) / 4
    assert metrics["accuracy"] == pytest.approx(mean)


def test_resume_skips_done_items_and_keeps_their_lines(needle4, make_loop, tmp_path):
    bench = NeedleBenchmark()
    annotations = str(needle4 / "eval.jsonl")
    loop, engine = make_loop()
    first = run_benchmark(bench, bench.load(annotations, "", limit=2), loop, str(tmp_path), FAST)
    assert first["num_samples"] == 2 and engine.requests == 2
    before = lines(tmp_path / PREDICTIONS)
    # A larger batch size resumes the same run: batching does not change what is evaluated.
    full = run_benchmark(
        bench, bench.load(annotations, ""), loop, str(tmp_path), replace(FAST, batch_size=4)
    )
    after = lines(tmp_path / PREDICTIONS)
    assert engine.requests == 4  # 2 + only the 2 new items
    assert after[:2] == before and len(after) == 4
    assert full["num_samples"] == 4
    # Nothing left to do: a third run makes no engine call and reports the same metrics.
    again = run_benchmark(bench, bench.load(annotations, ""), loop, str(tmp_path), FAST)
    assert engine.requests == 4 and again == full


def test_truncated_last_line_is_dropped_and_rerun(needle4, make_loop, tmp_path, caplog):
    bench = NeedleBenchmark()
    items = bench.load(str(needle4 / "eval.jsonl"), "")
    loop, engine = make_loop()
    run_benchmark(bench, items[:2], loop, str(tmp_path), FAST)
    path = tmp_path / PREDICTIONS
    good = path.read_text()
    with open(path, "a") as handle:  # a kill in the middle of writing item 2's line
        handle.write('{"id": "needle-eval-00002", "answ')
    with caplog.at_level(logging.WARNING, logger="paravt.eval.runner"):
        metrics = run_benchmark(bench, items, loop, str(tmp_path), FAST)
    assert "truncated last line" in caplog.text
    assert engine.requests == 4  # 2, then items 2 and 3
    text = path.read_text()
    assert text.startswith(good) and len(text.splitlines()) == 4
    assert [json.loads(x)["id"] for x in text.splitlines()][2:] == [
        "needle-eval-00002",
        "needle-eval-00003",
    ]
    assert metrics["num_samples"] == 4


def test_broken_line_before_the_end_is_an_error(tmp_path):
    path = tmp_path / PREDICTIONS
    path.write_text('{"id": "a", "score": {}}\nnot json\n{"id": "b", "score": {}}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_predictions(str(path))
    assert len(path.read_text().splitlines()) == 3  # never rewritten on an error


def test_missing_video_is_wrong_reported_and_not_run(needle4, make_loop, tmp_path):
    rows = [json.loads(x) for x in lines(needle4 / "eval.jsonl")][:2]
    rows[1]["videos"] = [{"video": "videos/absent.mp4"}]
    annotations = tmp_path / "eval.jsonl"
    annotations.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = NeedleBenchmark()
    items = bench.load(str(annotations), str(needle4))
    assert [i.video_missing for i in items] == [False, True]
    loop, engine = make_loop()
    metrics = run_benchmark(bench, items, loop, str(tmp_path / "out"), FAST)
    assert engine.requests == 1  # only the item whose video exists
    records = {r["id"]: r for r in map(json.loads, lines(tmp_path / "out" / PREDICTIONS))}
    missing = records[items[1].sample.id]
    assert missing["video_missing"]
    assert missing["score"] == {"accuracy": 0.0, "lmms_eval/accuracy": 0.0}
    assert missing["finish_reason"] == "skipped"
    assert metrics["missing_videos"] == 1 and metrics["num_samples"] == 2
    # accuracy = (score of item 0 + 0) / 2
    assert metrics["accuracy"] == pytest.approx(
        records[items[0].sample.id]["score"]["accuracy"] / 2
    )


def test_undecodable_video_is_recorded_and_the_batch_goes_on(needle4, make_loop, tmp_path):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"this is not a video" * 10)
    rows = [json.loads(x) for x in lines(needle4 / "eval.jsonl")][:2]
    rows[0]["videos"] = [{"video": str(bad)}]
    annotations = tmp_path / "eval.jsonl"
    annotations.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = NeedleBenchmark()
    items = bench.load(str(annotations), str(needle4))
    loop, engine = make_loop()
    metrics = run_benchmark(bench, items, loop, str(tmp_path / "out"), FAST)
    records = [json.loads(x) for x in lines(tmp_path / "out" / PREDICTIONS)]
    assert "bad.mp4" in records[0]["error"]
    assert records[0]["score"] == {"accuracy": 0.0, "lmms_eval/accuracy": 0.0}
    assert records[1]["error"] is None and records[1]["answer"].startswith("<think>")
    assert engine.requests == 1  # the batch of 2 failed before generating; item 1 alone ran
    assert metrics["video_errors"] == 1 and metrics["missing_videos"] == 0


def test_refuses_a_loop_with_another_forced_answer(needle4, make_loop, tmp_path):
    bench = NeedleBenchmark()
    loop, _ = make_loop(forced=MCQ_FORCED_ANSWER)
    with pytest.raises(ValueError, match=r"forced_answer=benchmark\.forced_answer"):
        run_benchmark(bench, [], loop, str(tmp_path), FAST)


def test_refuses_to_resume_under_another_protocol(needle4, make_loop, tmp_path):
    bench = NeedleBenchmark()
    loop, _ = make_loop()
    run_benchmark(bench, [], loop, str(tmp_path), FAST)
    with pytest.raises(ValueError, match="frame_budget"):
        run_benchmark(bench, [], loop, str(tmp_path), replace(FAST, frame_budget=8))


def test_needle_scores_letters_and_intervals(needle4):
    bench = NeedleBenchmark()
    items = bench.load(str(needle4 / "eval.jsonl"), "")
    mcq = next(i for i in items if i.sample.question_type == "mcq")
    wrong = next(x for x in "ABCD"[: len(mcq.sample.options)] if x != mcq.sample.answer)
    right = {"accuracy": 1.0, "lmms_eval/accuracy": 1.0}
    assert bench.score(mcq, f"<answer>{mcq.sample.answer}</answer>") == right
    assert bench.score(mcq, f"<answer>{wrong}</answer>") == {"accuracy": 0.0, **LMMS_WRONG}
    tvg = replace(items[0].sample, question_type="tvg", windows=((10.0, 20.0),))
    item = replace(items[0], sample=tvg)
    # [15, 25] vs [10, 20]: intersection 5, span 25 - 10 = 15 -> 1/3
    scores = bench.score(item, "<answer>[15, 25]</answer>")
    assert scores["accuracy"] == pytest.approx(1 / 3)
    # lmms-eval's Charades-STA parser on the needle's [a, b] read as "a - b": the same 1/3
    assert scores["lmms_eval/accuracy"] == pytest.approx(1 / 3)
    missing = bench.score(replace(item, video_missing=True), "<answer>[10, 20]</answer>")
    assert missing == {"accuracy": 0.0, **LMMS_WRONG}


LMMS_WRONG = {"lmms_eval/accuracy": 0.0}


def test_needle_loads_without_a_video_root_and_scores_its_own_gold_answers(tmp_path):
    from paravt.video.synthetic import NeedleConfig, generate

    generate(NeedleConfig(num_train=0, num_eval=3, families=(("ground", 1.0),), seed=2), tmp_path)
    bench = get_benchmark("needle")
    items = bench.load(str(tmp_path / "eval.jsonl"))  # no video_root: the file's own folder
    assert len(items) == 3 and not any(i.video_missing for i in items)
    for item in items:
        gold = item.sample.answer  # the generator's own form, e.g. "[38.5, 41.5]"
        assert re.fullmatch(r"\[\d+\.\d+, \d+\.\d+\]", gold), gold
        # Both figures give the gold answer IoU 1 (lmms-eval's read "[38.5, 41.5]" as 0).
        scores = bench.score(item, f"<think>\nThe needle.</think>\n<answer>{gold}</answer>")
        assert scores == {"accuracy": 1.0, "lmms_eval/accuracy": 1.0}


def test_needle_malformed_row_names_the_file(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps({"id": "x", "prompt": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(AnnotationError, match=r"eval\.jsonl: row 0"):
        NeedleBenchmark().load(str(path), "")


def test_make_benchmark_knows_needle_and_the_real_ones():
    assert make_benchmark("needle").name == "needle"
    assert make_benchmark("videomme").name == "videomme"
    with pytest.raises(ValueError, match="choose one of"):
        make_benchmark("videome")
    # An option the adapter does not take was a TypeError traceback from deep in evaluate.py.
    with pytest.raises(ValueError, match=r"'mmvu': .*'discipline' \(benchmark\.options takes: "):
        make_benchmark("mmvu", discipline={"Art": "Humanities"})
    with pytest.raises(ValueError, match=r"takes: none"):
        make_benchmark("needle", foo=1)
    with pytest.raises(ValueError, match=r"disciplines must map subject folders.*got 3"):
        make_benchmark("mmvu", disciplines=3)  # was an AttributeError on .items()


def test_format_metrics_shows_fractions_as_percent_and_counts_as_counts():
    table = format_metrics("needle", {"accuracy": 0.625, "num_samples": 8.0})
    # 0.625 -> 62.5 %; num_samples stays 8
    assert table.splitlines() == [
        "== needle ==",
        "metric       value",
        "accuracy     62.5",
        "num_samples  8",
    ]


def test_benchmarks_cap_the_forced_answer_turn():
    from paravt.eval.adapters import get_benchmark
    from paravt.eval.runner import EvalConfig, agent_config

    for name, cap in (("videomme", 64), ("mlvu", 64), ("charades", 128)):
        bench = get_benchmark(name)
        cfg = agent_config(EvalConfig(), bench.forced_answer, bench.forced_answer_max_tokens)
        assert (cfg.forced_answer, cfg.forced_answer_max_tokens) == (bench.forced_answer, cap)


def test_truncated_and_empty_videos_are_counted_listed_or_fail_fast(needle4, make_loop, tmp_path):
    from paravt.video.reader import VideoError

    rows = [json.loads(x) for x in lines(needle4 / "eval.jsonl")][:3]
    source = needle4 / rows[0]["videos"][0]["video"]
    data = source.read_bytes()
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "half.mp4").write_bytes(data[: len(data) // 3])
    rows[0]["videos"] = [{"video": str(tmp_path / "empty.mp4")}]
    rows[1]["videos"] = [{"video": str(tmp_path / "half.mp4")}]
    annotations = tmp_path / "eval.jsonl"
    annotations.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = NeedleBenchmark()
    items = bench.load(str(annotations), str(needle4))
    loop, _ = make_loop()
    with pytest.raises(VideoError):
        run_benchmark(bench, items, loop, str(tmp_path / "strict"), FAST, fail_fast=True)
    bad_row = "eval.jsonl: row 7: field 'question': missing"
    metrics = run_benchmark(bench, items, loop, str(tmp_path / "out"), FAST, bad_rows=[bad_row])
    assert metrics["video_errors"] == 2 and metrics["bad_rows"] == 1
    assert metrics["num_samples"] == 3
    report = (tmp_path / "out" / "results.md").read_text()
    assert report.count("undecodable video:") == 2 and f"bad row: {bad_row}" in report
    saved = json.loads((tmp_path / "out" / METRICS).read_text())
    assert len(saved["problems"]) == 3 and saved["metrics"] == metrics
