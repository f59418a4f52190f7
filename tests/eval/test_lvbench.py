from __future__ import annotations

import pytest

from paravt.eval.adapters import AnnotationError, get_benchmark

QUESTION = "What does the man hold?\n(A) a cup\n(B) a phone\n(C) a book\n(D) a key"


def _row(uid, answer, types, key="yt1"):
    return {
        "key": key,
        "type": "cartoon",
        "uid": uid,
        "video_path": f"{key}.mp4",
        "question": QUESTION,
        "answer": answer,
        "question_type": types,
        "time_reference": "01:10-01:20",
    }


def test_inline_options_parsed_and_multilabel_report(write_parquet, touch, tmp_path):
    touch("lv/yt1.mp4")
    rows = [
        _row(1, "B", ["entity recognition", "reasoning"]),
        _row(2, "C", ["reasoning"]),
        _row(3, "A", ["summarization"], key="yt2"),
    ]
    bench = get_benchmark("lvbench")
    items = bench.load(write_parquet(rows), str(tmp_path / "lv"))
    sample = items[0].sample
    assert sample.options == ("a cup", "a phone", "a book", "a key")
    assert sample.question.startswith("Question: What does the man hold?\nOptions:\nA. a cup\n")
    assert "(A)" not in sample.question
    assert sample.id == "1" and sample.answer == "B"
    assert items[0].groups == {"question_type": ("entity recognition", "reasoning")}
    assert items[2].video_missing
    scores = [bench.score(it, r) for it, r in zip(items, ["B", "B", "A"], strict=True)]
    report = bench.report(items, scores)
    # correct 1, 0, 0 (missing) -> 1/3; reasoning: items 0, 1 -> 1/2; entity: 1/1; summ.: 0/1
    assert report["accuracy"] == pytest.approx(1 / 3)
    assert report["accuracy/question_type=reasoning"] == 0.5
    assert report["accuracy/question_type=entity recognition"] == 1.0
    assert report["accuracy/question_type=summarization"] == 0.0
    # lmms-eval reads capitals only: "b" is nothing there
    lower = [bench.score(it, "b") for it in items[:1]]
    assert lower[0]["correct"] == 1.0 and lower[0]["lmms_eval/correct"] == 0.0
    assert report["lmms_eval/accuracy"] == pytest.approx(1 / 3)


def test_nested_meta_file(write_json, touch, tmp_path):
    touch("lv/yt9.mp4")
    meta = [
        {
            "key": "yt9",
            "type": "sport",
            "qa": [
                {"uid": "a", "question": QUESTION, "answer": "D", "question_type": ["reasoning"]},
                {"uid": "b", "question": QUESTION, "answer": "A", "question_type": ["reasoning"]},
            ],
            "video_info": {"duration_minutes": 60},
        }
    ]
    items = get_benchmark("lvbench").load(write_json(meta), str(tmp_path / "lv"))
    assert [i.sample.id for i in items] == ["a", "b"]
    assert not items[0].video_missing and items[0].sample.video.endswith("lv/yt9.mp4")


def test_bad_inline_options_raise(write_parquet, tmp_path):
    row = _row(1, "A", ["reasoning"])
    row["question"] = "What?\n(A) x\n(C) y"
    with pytest.raises(AnnotationError, match=r"row 0: field 'question': expected inline options"):
        get_benchmark("lvbench").load(write_parquet([row]), str(tmp_path))
