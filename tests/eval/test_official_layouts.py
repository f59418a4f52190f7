"""Rows in the official layouts, the answer rules and the torchmetrics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from paravt.eval import scoring
from paravt.eval.adapters import get_benchmark
from paravt.eval.adapters.base import AnnotationError, collect_row_errors
from paravt.eval.metrics import CategoryMean, GroundingMetric

OPTS = ("red", "green", "blue", "pink")


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("The answer is B.\nC is incorrect.", "B"),
        ("Answer: B\nReason: D shows nothing", "B"),
        ("C. blue\nbecause D is wrong", "C"),
        ("I looked closely.\nD", "D"),
        ("<think>A or C?</think>The answer is (C).", "C"),
        ("<think>x</think><answer>B</answer>\nA is wrong", "B"),
        ("Answer: A person walks in, so the answer is D", "D"),
        ("The answer is E.", None),  # not one of the sample's letters
    ],
)
def test_untagged_answers_follow_the_documented_order(response, letter):
    assert scoring.extract_choice(response, OPTS) == letter


def test_answer_phrase_rule_is_linear_on_hostile_text():
    import time

    hostile = "answer" + " " * 200_000 + "is" * 50_000 + "Answer:" * 50_000
    start = time.perf_counter()
    scoring._phrase_letter(hostile, "ABCD")
    scoring.parse_labelled_interval("start" + " " * 200_000 + "end time:" * 50_000)
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    ("response", "interval"),
    [
        ("Start time: 24.0 seconds\nEnd time: 30.0 seconds", (24.0, 30.0)),
        ("<answer>start: 0:24, end: 0:31.5</answer>", (24.0, 31.5)),
        ("The event ends at 30 and starts at 20.", (20.0, 30.0)),
        ("The event happens in the 3.5 - 7.0 seconds.", (3.5, 7.0)),
    ],
)
def test_labelled_intervals_are_read(response, interval):
    assert scoring.extract_interval(response) == pytest.approx(interval)


def test_unparseable_policies():
    wrong = scoring.choice_score("no idea", "A", OPTS, "wrong")
    assert wrong == {"correct": 0.0, "parsed": 0.0}
    excluded = scoring.choice_score("no idea", "A", OPTS, "exclude")
    assert excluded["excluded"] == 1.0
    draws = {
        scoring.choice_score("?", "A", OPTS, "random", key=f"q{i}")["correct"] for i in range(40)
    }
    assert draws == {0.0, 1.0}  # a random letter, sometimes right
    again = scoring.choice_score("?", "A", OPTS, "random", key="q1")
    assert again == scoring.choice_score("?", "A", OPTS, "random", key="q1")  # reruns agree


def test_exclude_policy_drops_unparseable_answers_from_the_denominator(write_parquet, tmp_path):
    rows = [_videomme_row(i) for i in range(3)]
    bench = get_benchmark("videomme")
    from dataclasses import replace

    excl = replace(bench, unparseable="exclude")
    (tmp_path / "v0.mp4").write_bytes(b"x")
    (tmp_path / "v2.mp4").write_bytes(b"x")
    items = excl.load(write_parquet(rows), str(tmp_path))
    answers = ["<answer>B</answer>", "<answer>B</answer>", "no idea"]
    report = excl.report(items, [excl.score(i, a) for i, a in zip(items, answers, strict=True)])
    assert report["excluded"] == 1.0 and report["unparseable"] == 1.0
    # item 0 right, item 1 missing video (wrong), item 2 left out: 1 / 2
    assert report["accuracy"] == pytest.approx(0.5)


def _videomme_row(i, sub="Humanity"):
    return {
        "video_id": f"{i:03d}",
        "duration": "short",
        "domain": "Knowledge",
        "sub_category": sub,
        "url": "https://youtube.com/x",
        "videoID": f"v{i}",
        "question_id": f"{i:03d}-1",
        "task_type": "OCR",
        "question": "Which?",
        "options": np.array(["A. Apples.", "B. Bananas.", "C. Cherries.", "D. Dates."]).tolist(),
        "answer": "B",
    }


def test_videomme_sub_category_and_unescaped_subtitles(write_parquet, tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    srt = "1\n00:00:01,000 --> 00:00:02,000\n<font color='x'>Tom &amp; Jerry&#39;s</font>\n"
    (subs / "v0.srt").write_text(srt)
    bench = get_benchmark("videomme_sub", subtitle_root=str(subs))
    items = bench.load(write_parquet([_videomme_row(0), _videomme_row(1, "Sports")]), str(tmp_path))
    assert "Tom & Jerry's" in items[0].sample.question and "&amp;" not in items[0].sample.question
    report = bench.report(items, [{"correct": 1.0}, {"correct": 0.0}])
    assert report["accuracy/sub_category=Humanity"] == 1.0
    assert report["accuracy/sub_category=Sports"] == 0.0


MMVU_URL = "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/{}/{}.mp4"


@pytest.mark.parametrize(
    ("folder", "discipline"),
    [
        ("Electromagnetism", "Science"),
        ("Modern_Physics", "Science"),
        ("Thermodynamics", "Science"),
        ("Neurobiology", "Science"),
        ("Mechanics", "Science"),
        ("Materials_Science", "Science"),
        ("Computer_Science", "Engineering"),
        ("Dentistry", "Healthcare"),
        ("Law", "Humanities & Social Science"),
    ],
)
def test_mmvu_discipline_follows_the_published_mapping(folder, discipline, write_json, tmp_path):
    row = {
        "id": "validation_0",
        "video": MMVU_URL.format(folder, 0),
        "youtube_url": "",
        "question_type": "multiple-choice",
        "metadata": {"subject": folder.replace("_", " "), "textbook": "", "knowledge": ""},
        "question": "Q?",
        "choices": {"A": "a", "B": "b", "C": "c", "D": "d", "E": "e"},
        "answer": "A",
    }
    (item,) = get_benchmark("mmvu").load(write_json([row]), str(tmp_path))
    assert item.groups["discipline"] == (discipline,)


def test_mlvu_official_per_task_json_layout(tmp_path):
    json_dir, video_root = tmp_path / "json", tmp_path / "video"
    json_dir.mkdir()
    needle = [
        {
            "video": "needle_1.mp4",
            "duration": 467.5,
            "question": "What does the hand hold?",
            "candidates": ["a cup", "a pen", "a key", "a phone"],
            "answer": "a key",
            "question_type": "findNeedle",
        }
    ]
    plot = [dict(needle[0], video="movie.mp4", answer="a pen", question_type="plotQA")]
    (json_dir / "2_needle.json").write_text(json.dumps(needle))
    (json_dir / "1_plotQA.json").write_text(json.dumps(plot))
    (json_dir / "9_summary.json").write_text(json.dumps([{"video": "s.mp4"}]))  # generation task
    (video_root / "2_needle").mkdir(parents=True)
    (video_root / "2_needle" / "needle_1.mp4").write_bytes(b"x")
    bench = get_benchmark("mlvu")
    items = bench.load(str(json_dir), str(video_root))
    assert [i.groups["task_type"] for i in items] == [("plotQA",), ("needle",)]
    assert [i.sample.answer for i in items] == ["B", "C"]  # option texts -> letters
    assert [i.video_missing for i in items] == [True, False]
    report = bench.report(items, [{"correct": 0.0}, {"correct": 1.0}])
    assert report["m_avg"] == pytest.approx(0.5)
    # one task file on its own reads the same
    (single,) = bench.load(str(json_dir / "2_needle.json"), str(video_root))
    assert single.sample.video == items[1].sample.video


def test_lvbench_finds_clean_videos(write_json, tmp_path):
    row = {
        "key": "abc",
        "type": "cartoon",
        "uid": "1",
        "question": "Q?\n(A) x\n(B) y\n(C) z\n(D) w",
        "answer": "A",
        "question_type": ["reasoning"],
        "time_reference": "00:01-00:02",
    }
    (tmp_path / "abc_clean.mp4").write_bytes(b"x")
    (item,) = get_benchmark("lvbench").load(write_json([row]), str(tmp_path))
    assert item.sample.video.endswith("abc_clean.mp4") and not item.video_missing


def test_charades_float16_gold_is_rounded_to_the_annotation(write_parquet, tmp_path):
    stamp = np.array([24.3, 30.4], dtype=np.float16).astype(float).tolist()
    assert stamp != [24.3, 30.4]  # the parquet's float16 really is off
    path = write_parquet(
        [{"video": "3MSZA.mp4", "caption": "person turn a light on.", "timestamp": stamp}]
    )
    (item,) = get_benchmark("charades").load(path, str(tmp_path))
    assert item.sample.windows == ((24.3, 30.4),)
    bench = get_benchmark("charades")
    answer = "Start time: 24.3 seconds\nEnd time: 30.4 seconds"
    report = bench.report([item], [scoring.score_grounding(answer, item.sample.windows[0])])
    assert report["miou"] == pytest.approx(1.0) and report["r@0.7"] == 1.0


def test_bad_rows_are_skipped_and_a_wrong_layout_is_one_error(write_parquet, tmp_path):
    good, bad = _videomme_row(0), _videomme_row(1)
    del bad["question"]
    path = write_parquet([good, bad])
    bench = get_benchmark("videomme")
    with pytest.raises(AnnotationError, match="row 1: field 'question'"):
        bench.load(path, str(tmp_path))  # strict on its own (fail fast)
    with collect_row_errors() as errors:
        items = bench.load(path, str(tmp_path))
    assert len(items) == 1 and "field 'question'" in str(errors[0])
    with pytest.raises(AnnotationError, match="no row fits the MLVU"), collect_row_errors():
        get_benchmark("mlvu").load(path, str(tmp_path))


def test_category_mean_and_grounding_metric():
    metric = CategoryMean(["task=a", "task=b"])
    labels = [["task=a"], ["task=a", "task=b"], ["task=b"]]
    metric.update(torch.tensor([1.0, 0.0, 1.0]), categories=labels)
    overall = metric.compute()
    assert isinstance(overall, torch.Tensor) and overall.dim() == 0
    assert float(overall) == pytest.approx(2 / 3)
    out = metric.per_category()
    assert out == pytest.approx({"overall": 2 / 3, "task=a": 0.5, "task=b": 0.5})
    with pytest.raises(ValueError, match="not declared"):
        CategoryMean(["x"]).update(torch.tensor([1.0]), categories=[["y"]])
    # Declared categories must be given; undeclared ones are refused, not ignored.
    with pytest.raises(ValueError, match="pass update"):
        CategoryMean(["x"]).update(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="built without categories"):
        CategoryMean().update(torch.tensor([1.0]), categories=[["x"]])
    # torchmetrics' (preds, target): the score of an item is preds == target.
    letters = CategoryMean()
    letters.update(torch.tensor([0, 2, 1, 3]), torch.tensor([0, 2, 3, 3]))
    assert float(letters.compute()) == pytest.approx(0.75)
    grounding = GroundingMetric()
    grounding.update(torch.tensor([0.2, 0.5, 0.8]))
    assert float(grounding.compute()) == pytest.approx(0.5)  # a tensor, as self.log wants
    assert grounding.per_threshold() == pytest.approx(
        {"miou": 0.5, "r@0.3": 2 / 3, "r@0.5": 2 / 3, "r@0.7": 1 / 3}
    )


def _reduce_worker(rank, world, port, out):
    import torch.distributed as dist

    from paravt.parallel.collectives import leave_group

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    metric = CategoryMean(["k=a", "k=b"])
    values = [[1.0, 1.0, 0.0], []][rank]  # uneven shards, one empty
    labels = [[["k=a"], ["k=b"], ["k=a"]], []][rank]
    metric.update(torch.tensor(values, dtype=torch.float64), categories=labels)
    result = {**metric.per_category(), "compute": float(metric.compute())}
    with open(f"{out}/{rank}.json", "w") as handle:
        json.dump(result, handle)
    leave_group()


def test_category_mean_reduces_across_ranks(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_reduce_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    want = {"overall": 2 / 3, "k=a": 0.5, "k=b": 1.0, "compute": 2 / 3}
    assert results[0] == results[1] == pytest.approx(want)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("a.json", b"not json", r"a\.json:1: invalid JSON .*pass the benchmark's own"),
        ("a.jsonl", b'{"a": 1}\n{bad\n', r"a\.jsonl:2: invalid JSON"),
        ("a.json", b'{"data": []}', r"a\.json: expected a JSON list of row objects, got dict"),
        (
            "a.json",
            b"[1, 2]",
            r"a\.json: expected a JSON list of row objects, got a list holding int",
        ),
        ("a.json", b"\xff\xfe[]", r"a\.json: cannot read as UTF-8 text"),
        (
            "a.parquet",
            b"PAR1 truncated",
            r"a\.parquet: cannot read as parquet .*pass the benchmark's own",
        ),
    ],
)
def test_an_unreadable_annotation_file_is_one_error_naming_it(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(AnnotationError, match=message) as caught:
        get_benchmark("videomme").load(str(path), str(tmp_path))
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
