from __future__ import annotations

import pytest

from paravt.eval.adapters import AnnotationError, get_benchmark
from paravt.eval.adapters.videomme import parse_srt


def _row(qid, video, answer, duration="long", domain="Knowledge", task="Counting Problem"):
    return {
        "video_id": qid.split("-")[0],
        "duration": duration,
        "domain": domain,
        "sub_category": "Humanity",
        "url": "https://www.youtube.com/watch?v=x",
        "videoID": video,
        "question_id": qid,
        "task_type": task,
        "question": "What fruit is shown?",
        "options": ["A. Apples.", "B. Bananas.", "C. Cherries.", "D. Dates."],
        "answer": answer,
    }


@pytest.fixture
def videomme_files(write_parquet, touch, tmp_path):
    rows = [
        _row("001-1", "vidA", "A"),
        _row("001-2", "vidA", "B", task="OCR"),
        _row("002-1", "vidB", "C", duration="short", domain="Sports"),
        _row("003-1", "vidC", "D", duration="short"),  # no video file: missing
    ]
    touch("videos/vidA.mp4")
    touch("videos/vidB.MKV_not_this")
    touch("videos/vidB.mkv")
    return write_parquet(rows), str(tmp_path / "videos")


def test_load_prompt_letters_once_and_paths(videomme_files):
    ann, root = videomme_files
    items = get_benchmark("videomme").load(ann, root)
    first = items[0].sample
    assert first.question == (
        "Question: What fruit is shown?\nOptions:\nA. Apples.\nB. Bananas.\nC. Cherries.\n"
        "D. Dates.\nAnswer with the option letter only."
    )
    assert "A. A." not in first.question
    assert first.options == ("Apples.", "Bananas.", "Cherries.", "Dates.")
    assert first.video.endswith("videos/vidA.mp4") and not items[0].video_missing
    assert items[2].sample.video.endswith("vidB.mkv") and not items[2].video_missing
    assert items[3].video_missing and items[3].sample.video.endswith("vidC.mp4")
    assert items[1].groups == {
        "duration": ("long",),
        "domain": ("Knowledge",),
        "sub_category": ("Humanity",),
        "task_type": ("OCR",),
    }
    assert [i.sample.id for i in get_benchmark("videomme").load(ann, root, limit=2)] == [
        "001-1",
        "001-2",
    ]


def test_score_and_report_by_group(videomme_files):
    ann, root = videomme_files
    bench = get_benchmark("videomme")
    items = bench.load(ann, root)
    responses = ["<answer>A</answer>", "<answer>C</answer>", "C", "<answer>D</answer>"]
    scores = [bench.score(it, r) for it, r in zip(items, responses, strict=True)]
    # The missing video scores 0 even though its response is right.
    assert [s["correct"] for s in scores] == [1.0, 0.0, 1.0, 0.0]
    report = bench.report(items, scores)
    # overall 2/4; long: items 0, 1 -> 1/2; short: items 2, 3 -> 1/2; Knowledge: 0, 1, 3 -> 1/3
    assert report["accuracy"] == 0.5
    assert report["accuracy/duration=long"] == 0.5
    assert report["accuracy/duration=short"] == 0.5
    assert report["accuracy/domain=Knowledge"] == pytest.approx(1 / 3)
    assert report["accuracy/domain=Sports"] == 1.0
    assert report["accuracy/task_type=OCR"] == 0.0
    assert report["missing_videos"] == 1.0 and report["num_samples"] == 4.0


def test_lmms_eval_figures_beside_the_official_ones(videomme_files):
    ann, root = videomme_files
    responses = ["a", "The answer is not A, it is B.", "<think>D</think>C", "D"]
    bench = get_benchmark("videomme")
    items = bench.load(ann, root)
    scores = [bench.score(it, r) for it, r in zip(items, responses, strict=True)]
    # lmms-eval reads capitals only and takes B after "answer is"; the official rule reads "a"
    # and declines two letters without an answer phrase naming one
    assert [s["correct"] for s in scores] == [1.0, 0.0, 1.0, 0.0]
    assert [s["lmms_eval/correct"] for s in scores] == [0.0, 1.0, 1.0, 0.0]
    report = bench.report(items, scores)
    assert report["accuracy"] == 0.5 and report["lmms_eval/accuracy"] == 0.5
    assert report["accuracy/task_type=OCR"] == 0.0
    assert report["lmms_eval/accuracy/task_type=OCR"] == 1.0
    # the official denominator (unparseable answers excluded) leaves lmms-eval's figure alone
    from paravt.eval.runner import make_benchmark

    excluding = make_benchmark("videomme", unparseable="exclude")
    scores = [excluding.score(it, r) for it, r in zip(items, responses, strict=True)]
    report = excluding.report(items, scores)
    assert report["accuracy"] == pytest.approx(2 / 3) and report["excluded"] == 1.0
    assert report["lmms_eval/accuracy"] == 0.5


def test_subtitles_prefix_all_text_and_font_tags(videomme_files, tmp_path):
    ann, root = videomme_files
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "vidA.srt").write_text(
        '\ufeff1\r\n00:00:01,000 --> 00:00:02,500\r\n<font color="#ffffff">Hello there</font>\r\n'
        "\r\n2\r\n00:00:03,000 --> 00:00:04,000\r\nsecond line\r\n100\r\n",
        encoding="utf-8",
    )
    items = get_benchmark("videomme_sub", subtitle_root=str(subs)).load(ann, root)
    assert items[0].sample.question.startswith(
        "This video's subtitles are listed below:\nHello there\nsecond line\n100\n\nQuestion: "
    )
    # vidB has no subtitle file: no prefix.
    assert items[2].sample.question.startswith("Question: ")
    assert items[0].sample.extra["has_subtitles"] and not items[2].sample.extra["has_subtitles"]


def test_parse_srt_keeps_a_numeric_subtitle():
    text = "1\n00:00:01,000 --> 00:00:02,000\n42\n\n2\n00:00:03.000 --> 00:00:04.000\n<i>ok</i>"
    assert parse_srt(text) == ["42", "ok"]


def test_videomme_sub_needs_a_subtitle_root(tmp_path):
    with pytest.raises(ValueError, match="subtitle_root"):
        get_benchmark("videomme_sub")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        get_benchmark("videomme_sub", subtitle_root=str(tmp_path / "nope"))


def test_malformed_rows_name_file_row_field(write_parquet, tmp_path):
    bad = _row("001-1", "vidA", "A")
    bad["options"] = ["Apples.", "B. Bananas."]  # not lettered
    ann = write_parquet([_row("000-1", "v", "A"), bad])
    with pytest.raises(AnnotationError, match=r"annotations.parquet: row 1: field 'options'"):
        get_benchmark("videomme").load(ann, str(tmp_path))
    wrong_gold = _row("001-1", "vidA", "E")
    ann = write_parquet([wrong_gold], "gold.parquet")
    with pytest.raises(AnnotationError, match=r"row 0: field 'answer'.*'E'"):
        get_benchmark("videomme").load(ann, str(tmp_path))
    no_id = _row("001-1", "vidA", "A")
    del no_id["videoID"]
    ann = write_parquet([no_id], "noid.parquet")
    with pytest.raises(AnnotationError, match=r"field 'videoID': missing"):
        get_benchmark("videomme").load(ann, str(tmp_path))


def test_duplicate_ids_rejected(write_parquet, tmp_path):
    ann = write_parquet([_row("001-1", "v", "A"), _row("001-1", "v", "B")])
    with pytest.raises(AnnotationError, match="duplicate id '001-1'"):
        get_benchmark("videomme").load(ann, str(tmp_path))
