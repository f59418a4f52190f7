from __future__ import annotations

import pytest

from paravt.eval.adapters import AnnotationError, get_benchmark


def _row(qid, task, answer, name="v.mp4"):
    return {
        "video_name": name,
        "duration": 300.0,
        "question": "How many birds?\n(A) one\n(B) two\n(C) three",
        "candidates": ["one", "two", "three"],
        "answer": answer,
        "task_type": task,
        "question_id": qid,
    }


def test_letter_and_text_answers_and_m_avg(write_parquet, touch, tmp_path):
    touch("mlvu/count/v.mp4")  # per-task folder layout
    touch("mlvu/needle/v.mp4")
    rows = [
        _row("q1", "count", "B"),  # a letter
        _row("q2", "count", "three"),  # an option text
        _row("q3", "count", "(A)"),
        _row("q4", "needle", "Two "),  # text, case and spaces ignored
    ]
    bench = get_benchmark("mlvu")
    items = bench.load(write_parquet(rows), str(tmp_path / "mlvu"))
    assert [i.sample.answer for i in items] == ["B", "C", "A", "B"]
    assert items[0].sample.question.startswith("Question: How many birds?\nOptions:\nA. one\n")
    assert items[0].sample.video.endswith("mlvu/count/v.mp4")
    assert not items[0].video_missing
    responses = ["<answer>B</answer>", "<answer>A</answer>", "A", "<answer>two</answer>"]
    report = bench.report(
        items, [bench.score(it, r) for it, r in zip(items, responses, strict=True)]
    )
    # correct 1, 0, 1, 1 -> overall 3/4; count 2/3, needle 1/1; M-Avg (2/3 + 1) / 2 = 5/6
    assert report["accuracy"] == 0.75
    assert report["accuracy/task_type=count"] == pytest.approx(2 / 3)
    assert report["m_avg"] == pytest.approx(5 / 6)
    # lmms-eval: "two" reads as nothing (no capital); its M-Avg divides by all 7 dev task types
    assert report["lmms_eval/accuracy"] == 0.5
    assert report["lmms_eval/m_avg"] == pytest.approx((2 / 3 + 0) / 7)


def test_unknown_answer_raises(write_json, tmp_path):
    ann = write_json([_row("q1", "count", "four")])
    with pytest.raises(AnnotationError, match=r"row 0: field 'answer': 'four' is neither"):
        get_benchmark("mlvu").load(ann, str(tmp_path))


def test_missing_question_id_falls_back(write_json, tmp_path):
    row = _row("x", "ego", "A")
    del row["question_id"]
    items = get_benchmark("mlvu").load(write_json([row]), str(tmp_path))
    assert items[0].sample.id == "ego-0" and items[0].video_missing
