from __future__ import annotations

import pytest

from paravt.eval.adapters import AnnotationError, get_benchmark


def _parquet_row(i, correct, options, group=600, category="T3O"):
    row = {
        "video_id": f"v{i}",
        "id": f"v{i}_0",
        "video_path": f"v{i}.mp4",
        "subtitle_path": f"v{i}_en.json",
        "correct_choice": correct,
        "question": f"Question {i}?",
        "duration": 123.5,
        "duration_group": group,
        "question_category": category,
        "topic_category": "NP-News-Programs",
        "starting_timestamp_for_subtitles": 0.0,
    }
    row.update({f"option{k}": opt for k, opt in enumerate(options)})
    return row


def test_parquet_na_options_gold_letters_and_report(write_parquet, touch, tmp_path):
    rows = [
        _parquet_row(0, 2, ["a", "b", "c", "N/A", "N/A"]),
        _parquet_row(1, 4, ["a", "b", "c", "d", "e"], group=3600, category="E2O"),
        _parquet_row(2, 0, ["a", "b", "c", "d", "N/A"], group=3600),
    ]
    touch("lvb/videos/v0.mp4")
    touch("lvb/videos/v1.mp4")
    bench = get_benchmark("longvideobench")
    items = bench.load(write_parquet(rows), str(tmp_path / "lvb"))
    assert items[0].sample.options == ("a", "b", "c")  # "N/A" skipped
    assert "D." not in items[0].sample.question
    assert [i.sample.answer for i in items] == ["C", "E", "A"]  # chr(65 + correct_choice)
    assert items[0].sample.video == str(tmp_path / "lvb" / "videos" / "v0.mp4")
    assert [i.video_missing for i in items] == [False, False, True]
    assert items[1].groups == {"duration_group": ("3600",), "question_category": ("E2O",)}
    scores = [
        bench.score(it, r) for it, r in zip(items, ["C", "<answer>A</answer>", "A"], strict=True)
    ]
    report = bench.report(items, scores)
    # correct: 1, 0, 0 (missing) -> 1/3; group 600: 1/1; 3600: 0/2; T3O: items 0, 2 -> 1/2
    assert report["accuracy"] == pytest.approx(1 / 3)
    assert report["accuracy/duration_group=600"] == 1.0
    assert report["accuracy/duration_group=3600"] == 0.0
    assert report["accuracy/question_category=T3O"] == 0.5
    assert report["missing_videos"] == 1.0
    # lmms-eval: the first capital A-E ("A" of "Answer"), a random guess when there is none
    first, second = bench.score(items[0], "I am not sure."), bench.score(items[1], "Answer: E")
    assert first["correct"] == 0.0 and first["lmms_eval/guessed"] == 1.0
    assert second["correct"] == 1.0 and second["lmms_eval/correct"] == 0.0
    assert report["lmms_eval/accuracy"] == pytest.approx(0.33333)  # rounded to 5 decimals


def test_json_candidates_variant(write_json, tmp_path):
    row = _parquet_row(0, 1, [])
    row["candidates"] = ["x", "y", "z"]
    row["duration_group"] = 15.0
    items = get_benchmark("longvideobench").load(write_json([row]), str(tmp_path))
    assert items[0].sample.options == ("x", "y", "z") and items[0].sample.answer == "B"
    assert items[0].groups["duration_group"] == ("15",)


@pytest.mark.parametrize(
    ("correct", "options", "match"),
    [
        (3, ["a", "b", "c", "N/A", "N/A"], r"row 0: field 'correct_choice': points at 'N/A'"),
        (7, ["a", "b", "c", "d", "e"], r"field 'correct_choice': 7 is not in 0..5"),
        ("1", ["a", "b", "c", "d", "e"], r"field 'correct_choice': expected a non-empty int"),
    ],
)
def test_malformed_gold(write_parquet, tmp_path, correct, options, match):
    ann = write_parquet([_parquet_row(0, correct, options)])
    with pytest.raises(AnnotationError, match=match):
        get_benchmark("longvideobench").load(ann, str(tmp_path))
