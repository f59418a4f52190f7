from __future__ import annotations

import pytest

from paravt.eval.adapters import AnnotationError, get_benchmark

URL = "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/{subject}/{n}.mp4"


def _row(i, subject, qtype="multiple-choice", answer="B"):
    return {
        "id": f"validation_{i}",
        "video": URL.format(subject=subject, n=i),
        "youtube_url": "https://youtube.com/x",
        "question_type": qtype,
        "metadata": {"subject": subject, "textbook": "t", "knowledge": "k", "rationale": "r"},
        "question": "Which law is shown?",
        "choices": {"A": "Ohm", "B": "Hooke", "C": "Newton", "D": "Snell", "E": ""},
        "answer": answer if qtype == "multiple-choice" else "free text",
    }


def test_filter_paths_disciplines_and_report(write_json, touch, tmp_path):
    rows = [
        _row(0, "Mechanics"),
        _row(1, "Clinical_Medicine", qtype="open-ended"),  # dropped
        _row(2, "Clinical_Medicine", answer="A"),
        _row(3, "Underwater_Basketweaving"),  # not in the mapping
    ]
    touch("mmvu/videos/Mechanics/0.mp4")
    bench = get_benchmark("mmvu")
    items = bench.load(write_json(rows), str(tmp_path / "mmvu"))
    assert [i.sample.id for i in items] == ["validation_0", "validation_2", "validation_3"]
    assert items[0].sample.video == str(tmp_path / "mmvu" / "videos" / "Mechanics" / "0.mp4")
    assert items[0].sample.options == ("Ohm", "Hooke", "Newton", "Snell")  # empty E dropped
    assert [i.groups["discipline"] for i in items] == [("Science",), ("Healthcare",), ("other",)]
    assert [i.video_missing for i in items] == [False, True, True]
    scores = [bench.score(it, "<answer>B</answer>") for it in items]
    report = bench.report(items, scores)
    # correct 1, 0 (missing), 0 (missing) -> 1/3; Science 1/1; Healthcare 0/1
    assert report["accuracy"] == pytest.approx(1 / 3)
    assert report["accuracy/discipline=Science"] == 1.0
    assert report["accuracy/discipline=Healthcare"] == 0.0
    assert report["missing_videos"] == 2.0 and report["num_samples"] == 3.0
    # lmms-eval counts only its 27 subject folders: Mechanics 1, Clinical_Medicine 0 -> 1/2
    assert [s["lmms_eval/correct"] for s in scores] == [1.0, 0.0, 0.0]
    assert report["lmms_eval/accuracy"] == 0.5
    # and credits the gold option's text anywhere in the answer, in any case ("Hooke", B)
    assert bench.score(items[0], "HOOKE's law")["lmms_eval/correct"] == 1.0
    # limit counts kept (multiple-choice) rows.
    assert len(bench.load(write_json(rows), str(tmp_path), limit=2)) == 2


def test_custom_disciplines(write_json, tmp_path):
    bench = get_benchmark("mmvu", disciplines={"Underwater_Basketweaving": "Humanities"})
    items = bench.load(write_json([_row(3, "Underwater_Basketweaving")]), str(tmp_path))
    assert items[0].groups["discipline"] == ("Humanities",)


def test_bad_video_url_names_row(write_json, tmp_path):
    row = _row(0, "Mechanics")
    row["video"] = "https://example.com/clip.mp4"
    with pytest.raises(AnnotationError, match=r"row 0: field 'video'"):
        get_benchmark("mmvu").load(write_json([_row(5, "Mechanics"), row][::-1]), str(tmp_path))
