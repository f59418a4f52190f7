from __future__ import annotations

import pytest

from paravt.eval.adapters import AnnotationError, get_benchmark
from paravt.eval.adapters.base import collect_row_errors


@pytest.fixture
def parquet_items(write_parquet, touch, tmp_path):
    rows = [
        {"video": "AAAAA.mp4", "caption": "person opens a door.", "timestamp": [12.0, 20.0]},
        {"video": "BBBBB.mp4", "caption": "person sits down.", "timestamp": [0.0, 10.0]},
        {"video": "CCCCC", "caption": "person laughs.", "timestamp": [5.0, 9.0]},
        {"video": "DDDDD.mp4", "caption": "person eats.", "timestamp": [1.0, 2.0]},  # missing
    ]
    for name in ("AAAAA.mp4", "BBBBB.mp4", "CCCCC.mp4"):
        touch(f"ch/{name}")
    return get_benchmark("charades"), get_benchmark("charades").load(
        write_parquet(rows), str(tmp_path / "ch")
    )


def test_load_parquet(parquet_items):
    _, items = parquet_items
    first = items[0].sample
    assert first.question_type == "tvg" and first.answer == "[12, 20]"
    assert first.windows == ((12.0, 20.0),)
    assert "person opens a door." in first.question
    assert items[2].sample.video.endswith("ch/CCCCC.mp4") and not items[2].video_missing
    assert items[3].video_missing and first.id == "AAAAA-0"


def test_scores_and_report(parquet_items):
    bench, items = parquet_items
    responses = [
        "<answer>The event happens in the 10.0 - 15.0 seconds.</answer>",  # IoU 3/10 = 0.3
        "The event happens in the 0.0 - 8.0 seconds.",  # IoU 8/10 = 0.8
        "I cannot tell.",  # unparseable: 0
        "The event happens in the 1.0 - 2.0 seconds.",  # missing video: 0
    ]
    scores = [bench.score(it, r) for it, r in zip(items, responses, strict=True)]
    assert [s["iou"] for s in scores] == pytest.approx([0.3, 0.8, 0.0, 0.0])
    report = bench.report(items, scores)
    # mIoU = (0.3 + 0.8 + 0 + 0) / 4 = 0.275; R@0.3 = 2/4; R@0.5 = 1/4; R@0.7 = 1/4
    assert report["miou"] == pytest.approx(0.275)
    assert report["r@0.3"] == 0.5
    assert report["r@0.5"] == 0.25
    assert report["r@0.7"] == 0.25
    assert report["missing_videos"] == 1.0 and report["num_samples"] == 4.0


def test_lmms_eval_figures_beside_the_official_ones(parquet_items):
    bench, items = parquet_items
    responses = ["[10.0, 15.0]", "from 0 to 8 seconds", "0:05-0:09", "1.0 - 2.0"]
    scores = [bench.score(it, r) for it, r in zip(items, responses, strict=True)]
    # lmms-eval's parser reads no bracketed pair and turns "to" into a dash
    assert scores[0]["iou"] == pytest.approx(0.3)
    assert [s["lmms_eval/iou"] for s in scores] == pytest.approx([0.0, 0.8, 1.0, 0.0])
    report = bench.report(items, scores)
    assert report["lmms_eval/miou"] == pytest.approx(0.45)
    assert report["lmms_eval/r@0.7"] == 0.5 and report["lmms_eval/r@0.3"] == 0.5


def test_txt_format(tmp_path, touch):
    touch("ch/3MSZA.mp4")
    ann = tmp_path / "charades_sta_test.txt"
    ann.write_text("3MSZA 24.3 30.4##person turn a light on.\n\n3MSZA 0 5.5##person sits.\n")
    items = get_benchmark("charades").load(str(ann), str(tmp_path / "ch"))
    assert [i.sample.windows for i in items] == [((24.3, 30.4),), ((0.0, 5.5),)]
    assert items[0].sample.extra["caption"] == "person turn a light on."
    assert [i.sample.id for i in items] == ["3MSZA-0", "3MSZA-1"]
    assert not items[0].video_missing


@pytest.mark.parametrize(
    "line", ["3MSZA 24.3##no end", "3MSZA 24.3 30.4 person no separator", "3MSZA a b##x"]
)
def test_bad_txt_line_raises(tmp_path, line):
    ann = tmp_path / "bad.txt"
    ann.write_text(f"3MSZA 1 2##ok\n{line}\n")
    with pytest.raises(AnnotationError, match=r"bad.txt: row 1: field 'line'"):
        get_benchmark("charades").load(str(ann), str(tmp_path))


def test_a_bad_txt_line_is_skipped_and_reported_when_collecting(tmp_path):
    ann = tmp_path / "sta_test.txt"
    ann.write_text("3MSZA 1 2##ok\n3MSZA 24.3##no end\nAB12C 3 4.5##fine too\n")
    with collect_row_errors() as errors:
        items = get_benchmark("charades").load(str(ann), str(tmp_path))
    assert [i.sample.id for i in items] == ["3MSZA-0", "AB12C-2"]
    assert len(errors) == 1 and "row 1: field 'line'" in str(errors[0])
    ann.write_bytes(b"3MSZA 1 2##caf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(AnnotationError, match=r"sta_test.txt: cannot read as UTF-8 text"):
        get_benchmark("charades").load(str(ann), str(tmp_path))


@pytest.mark.parametrize("timestamp", [[5.0], [9.0, 5.0], ["a", "b"]])
def test_bad_timestamp_raises(write_json, tmp_path, timestamp):
    ann = write_json([{"video": "x.mp4", "caption": "c", "timestamp": timestamp}])
    with pytest.raises(AnnotationError, match=r"row 0: field 'timestamp'"):
        get_benchmark("charades").load(ann, str(tmp_path))
