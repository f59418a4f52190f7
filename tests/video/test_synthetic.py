"""Needle data: the videos really show what the rows say, and the defaults really need search."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from paravt.video.reader import VideoReader
from paravt.video.sampling import uniform_indices
from paravt.video.synthetic import (
    LETTERS,
    PALETTE,
    SHAPES,
    NeedleConfig,
    generate,
    main,
    make_rows,
)

# 16 s at 2.5 fps = 40 frames of 64 x 48; 2 s needles = 5 frames; needle side 0.3 * 48 ~ 14 px.
# Seed 7 gives train families order, ground, color, ground: all three are covered.
TINY = NeedleConfig(
    num_train=4,
    num_eval=2,
    duration=16.0,
    fps=2.5,
    width=64,
    height=48,
    needle_seconds=2.0,
    seed=7,
)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("needle")
    generate(TINY, out)
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _all_rows(out: Path) -> list[dict]:
    return _rows(out / "train.jsonl") + _rows(out / "eval.jsonl")


def _decode(out: Path, row: dict) -> tuple[np.ndarray, float]:
    path = str(out / row["videos"][0]["video"])
    with VideoReader() as reader:
        info = reader.info(path)
        frames = reader.read(path, range(info.num_frames), max_pixels=10**6, factor=16)
    return frames.pixels.astype(int), info.fps  # [K, 48, 64, 3] at the original size


def _appearances(pixels: np.ndarray, fps: float) -> list[dict]:
    """What the video shows, from pixels alone: coloured blobs, their shape, colour and times."""
    saturated = pixels.max(-1) - pixels.min(-1) > 80  # palette colours ~180+, grey ~0
    seen: list[dict] = []
    for f, mask in enumerate(saturated):
        if not mask.any():
            continue
        ys, xs = np.nonzero(mask)
        y, x, size = int(ys.min()), int(xs.min()), int(max(np.ptp(ys), np.ptp(xs)) + 1)
        blob = mask[y : y + size, x : x + size]
        grid = np.mgrid[:size, :size]
        iou = {
            n: (blob & m(*grid, size)).sum() / (blob | m(*grid, size)).sum()
            for n, m in SHAPES.items()
        }
        mean = pixels[f][mask].mean(0)
        colour = min(PALETTE, key=lambda c: np.abs(np.asarray(PALETTE[c]) - mean).sum())
        kind = {"color": colour, "shape": max(iou, key=iou.get), "box": [x, y, size]}
        if seen and seen[-1]["kind"] == kind and seen[-1]["last"] == f - 1:
            seen[-1]["last"] = f
        else:
            seen.append({"kind": kind, "first": f, "last": f})
    return [
        {**s["kind"], "window": [round(s["first"] / fps, 2), round((s["last"] + 1) / fps, 2)]}
        for s in seen
    ]


def test_videos_decode_to_the_stated_duration(tiny_data):
    with VideoReader() as reader:
        for row in _all_rows(tiny_data):
            info = reader.info(str(tiny_data / row["videos"][0]["video"]))
            assert info.num_frames == 40  # 16 s * 2.5 fps
            assert info.fps == pytest.approx(2.5)
            assert info.duration == pytest.approx(16.0) == row["extra_info"]["duration"]


def test_frames_show_the_stated_needles_and_nothing_else(tiny_data):
    for row in _all_rows(tiny_data):
        pixels, fps = _decode(tiny_data, row)
        shown = _appearances(pixels, fps)
        stated = sorted(row["extra_info"]["needles"], key=lambda n: n["window"][0])
        assert [{k: n[k] for k in ("color", "shape", "box", "window")} for n in stated] == shown
        # the background between needles really is grey, and frames differ (it drifts)
        assert not np.array_equal(pixels[0], pixels[-1])


def test_answers_match_what_the_video_shows(tiny_data):
    families = set()
    for row in _all_rows(tiny_data):
        extra, text = row["extra_info"], row["prompt"][0]["content"]
        pixels, fps = _decode(tiny_data, row)
        shown = {f"{a['color']} {a['shape']}": a for a in _appearances(pixels, fps)}
        families.add(extra["family"])
        if extra["family"] == "color":
            shape = re.search(r"What colour is the (\w+) that", text).group(1)
            (colour,) = [a["color"] for a in shown.values() if a["shape"] == shape]
            assert extra["options"][LETTERS.index(extra["answer"])] == colour
        elif extra["family"] == "order":
            starts = [shown[option]["window"][0] for option in extra["options"]]
            assert extra["answer"] == LETTERS[int(np.argmin(starts))]
        else:
            kind = re.search(r"When does the (\w+ \w+) appear", text).group(1)
            start, end = shown[kind]["window"]
            assert extra["answer"] == f"[{start}, {end}]"
            assert extra["question_type"] == "tvg" and extra["windows"] == [[start, end]]
    assert families == {"color", "order", "ground"}


def test_rows_follow_the_rl_schema(tiny_data):
    for split in ("train", "eval"):
        for index, row in enumerate(_rows(tiny_data / f"{split}.jsonl")):
            assert row["id"] == f"needle-{split}-{index:05d}"
            assert row["data_source"] == "needle"
            assert row["videos"] == [{"video": f"videos/{row['id']}.mp4"}]
            assert (tiny_data / row["videos"][0]["video"]).is_file()  # relative to the data dir
            (message,) = row["prompt"]
            assert message["role"] == "user" and message["content"].startswith("<video>\n")
            extra = row["extra_info"]
            if extra["question_type"] == "mcq":
                lines = [f"{LETTERS[i]}. {o}" for i, o in enumerate(extra["options"])]
                assert message["content"].endswith("\nOptions:\n" + "\n".join(lines))
                assert extra["answer"] in LETTERS[: len(extra["options"])]


def test_parquet_and_jsonl_hold_the_same_rows(tiny_data):
    for split in ("train", "eval"):
        jsonl = _rows(tiny_data / f"{split}.jsonl")
        assert pq.read_table(tiny_data / f"{split}.parquet").to_pylist() == jsonl
    saved = json.loads((tiny_data / "config.json").read_text())
    assert saved["fps"] == 2.5 and saved["duration"] == 16.0 and saved["seed"] == 7


def test_generation_is_deterministic(tiny_data, tmp_path):
    generate(TINY, tmp_path)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_text() == (tiny_data / name).read_text()
    for video in (tiny_data / "videos").iterdir():
        assert (tmp_path / "videos" / video.name).read_bytes() == video.read_bytes()


def test_seed_changes_the_data():
    other = NeedleConfig(**{**TINY.__dict__, "seed": 8})
    assert make_rows(other, "train") != make_rows(TINY, "train")


def test_splits_are_disjoint_and_eval_is_its_own_stream():
    train, evals = make_rows(TINY, "train"), make_rows(TINY, "eval")
    assert not {r["id"] for r in train} & {r["id"] for r in evals}
    assert train[0]["extra_info"]["needles"] != evals[0]["extra_info"]["needles"]
    # eval rows do not depend on how many train rows there are
    more_train = NeedleConfig(**{**TINY.__dict__, "num_train": 9})
    assert make_rows(more_train, "eval") == evals


def test_default_config_needs_search():
    cfg = NeedleConfig(num_train=300, num_eval=0)
    rows = make_rows(cfg, "train")
    for row in rows:
        low, high = row["extra_info"]["hint_window"]
        assert high - low == 32.0 > 16.0  # a half of 64 s; one crop shows 16 s at 1 fps
        assert all(low <= s and e <= high for s, e in row["extra_info"]["windows"])

    def miss_rate(k: int) -> float:
        # 64 s at 2 fps = 128 frames; a target is seen if an overview frame falls in its frames
        overview = uniform_indices(128, k)
        missed = [
            any(
                not any(n["frames"][0] <= i < n["frames"][1] for i in overview)
                for n in row["extra_info"]["needles"]
                if n["target"]
            )
            for row in rows
        ]
        return sum(missed) / len(missed)

    # one 3 s needle vs 4 frames 16 s apart: seen ~ 3/16 of the time; order needs two needles
    assert miss_rate(4) > 0.7
    assert miss_rate(8) > 0.5


def test_color_distractors_are_other_shapes_and_lure_in_the_options():
    cfg = NeedleConfig(num_train=60, num_eval=0, families=(("color", 1.0),), distractors=2)
    for row in make_rows(cfg, "train"):
        extra = row["extra_info"]
        (target,) = [n for n in extra["needles"] if n["target"]]
        others = [n for n in extra["needles"] if not n["target"]]
        assert len(others) == 2 and all(n["shape"] != target["shape"] for n in others)
        assert len(set(extra["options"])) == 4
        assert extra["options"][LETTERS.index(extra["answer"])] == target["color"]
        assert {n["color"] for n in others} - {target["color"]} <= set(extra["options"])


def test_order_answer_is_the_earlier_target():
    cfg = NeedleConfig(num_train=60, num_eval=0, families=(("order", 1.0),))
    for row in make_rows(cfg, "train"):
        extra = row["extra_info"]
        targets = {f"{n['color']} {n['shape']}": n for n in extra["needles"] if n["target"]}
        starts = [targets[o]["window"][0] for o in extra["options"]]
        assert extra["answer"] == LETTERS[int(np.argmin(starts))]
        assert starts[0] != starts[1]


@pytest.mark.parametrize(
    ("hint", "span", "phrase"),
    [("exact", 10.0, r"between \d+ s and \d+ s"), ("none", 64.0, r"^$")],
)
def test_exact_and_no_hint(hint, span, phrase):
    cfg = NeedleConfig(num_train=30, num_eval=0, hint=hint)
    for row in make_rows(cfg, "train"):
        extra = row["extra_info"]
        low, high = extra["hint_window"]
        assert high - low == span and re.search(phrase, extra["hint"])
        assert all(low <= s and e <= high for s, e in extra["windows"])
        if hint == "none" and extra["family"] == "color":
            assert "that appears in the video?" in row["prompt"][0]["content"]


def test_coarse_thirds():
    cfg = NeedleConfig(num_train=30, num_eval=0, coarse_span=3, duration=60.0)
    hints = {row["extra_info"]["hint"] for row in make_rows(cfg, "train")}
    assert hints <= {f"in the {p} third of the video" for p in ("first", "middle", "last")}
    assert len(hints) > 1


def test_fractional_fps_video(tmp_path):
    # 4 s at 29.97 fps -> round(119.88) = 120 frames; a 1 s needle -> round(29.97) = 30 frames
    cfg = NeedleConfig(
        num_train=1, num_eval=0, duration=4.0, fps=29.97, width=32, height=32,
        needle_seconds=1.0, distractors=0, families=(("ground", 1.0),),
    )  # fmt: skip
    generate(cfg, tmp_path)
    (row,) = _rows(tmp_path / "train.jsonl")
    (needle,) = row["extra_info"]["needles"]
    assert needle["frames"][1] - needle["frames"][0] == 30
    with VideoReader() as reader:
        info = reader.info(str(tmp_path / row["videos"][0]["video"]))
    assert info.num_frames == 120 and info.fps == pytest.approx(29.97, abs=1e-3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"width": 63}, "even"),
        ({"palette": ("red", "green", "blue")}, ">= 4 colours"),
        ({"palette": ("red", "green", "blue", "teal")}, "palette colours"),
        ({"hint": "vague"}, "hint must be one of"),
        ({"families": (("color", 0.0),)}, "sum to > 0"),
        ({"needle_seconds": 64.0}, "needle_seconds"),
    ],
)
def test_config_errors_name_the_knob(change, message):
    with pytest.raises(ValueError, match=message):
        NeedleConfig(**change)


def test_placement_failure_names_the_fix():
    cfg = NeedleConfig(num_train=1, num_eval=0, duration=8.0, needle_seconds=3.0, distractors=3)
    with pytest.raises(ValueError, match="lower needle_seconds or distractors"):
        make_rows(cfg, "train")


def test_cli_writes_data_with_every_knob(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--num-train", "2", "--num-eval", "1", "--duration", "8"]
    argv += ["--fps", "2.5", "--width", "32", "--height", "32", "--needle-seconds", "1.5"]
    argv += ["--hint", "exact", "--exact-span", "6", "--families", "ground=1,color=0.5"]
    argv += ["--palette", "red,green,blue,yellow", "--seed", "3", "--distractors", "0"]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["families"] == [["ground", 1.0], ["color", 0.5]]
    assert saved["palette"] == ["red", "green", "blue", "yellow"] and saved["exact_span"] == 6.0
    assert len(_rows(tmp_path / "train.jsonl")) == 2 and len(_rows(tmp_path / "eval.jsonl")) == 1
    assert "wrote 2 train + 1 eval" in capsys.readouterr().out


def test_cli_help_shows_every_default_in_the_form_its_option_takes(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    argv = ["--out", str(tmp_path)]
    for field in dataclasses.fields(NeedleConfig):
        flag = "--" + field.name.replace("_", "-")
        found = re.search(rf"{flag} \S+\s+default: (\S+)", shown)
        assert found, f"{flag} has no default in --help"
        argv += [flag, found.group(1)]
    # e.g. "--families color=1.0,order=1.0,ground=1.0", not the refused "(('color', 1.0), ...)";
    # every shown default given back builds the default config (no videos: 0 + 0 samples)
    assert "default: color=1.0,order=1.0,ground=1.0" in shown
    assert main([*argv, "--num-train", "0", "--num-eval", "0"]) == 0
    saved = json.loads((tmp_path / "config.json").read_text())
    default = dataclasses.asdict(NeedleConfig(num_train=0, num_eval=0))
    assert saved == json.loads(json.dumps(default))


def test_cli_reports_bad_knobs(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--width", "63"]) == 2
    assert "width and height must be even" in capsys.readouterr().err
    # A flag that is neither true nor false was read as false (no shuffling), silently.
    with pytest.raises(SystemExit) as exited:
        main(["--out", str(tmp_path), "--shuffle-options", "maybe"])
    assert (
        exited.value.code == 2 and "expected true or false (got 'maybe')" in capsys.readouterr().err
    )


def test_data_is_regenerated_when_its_config_differs_and_kept_when_not(tmp_path):
    from paravt.video.synthetic import ensure_needle_data

    small = NeedleConfig(
        num_train=2, num_eval=1, duration=16.0, fps=1.0, needle_seconds=2.0, seed=5
    )
    assert ensure_needle_data(small, tmp_path)
    assert not ensure_needle_data(small, tmp_path)  # same config: nothing rewritten
    bigger = dataclasses.replace(small, num_train=3)
    assert ensure_needle_data(bigger, tmp_path)
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 3
