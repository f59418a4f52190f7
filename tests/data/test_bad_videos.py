"""Bad videos at load: real truncated, empty and one-frame mp4s are skipped, counted, reported;
`fail_fast` stops on the first one with a one-line user error.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from paravt.data.datasets import BadRowError, load_samples
from paravt.errors import UserError
from paravt.video.writer import write_video

QUESTION = "What colour is the square?\nOptions:\nA. red\nB. green"


def _row(name: str) -> dict:
    return {
        "id": name,
        "prompt": [{"role": "user", "content": f"<video>\n{QUESTION}"}],
        "videos": [{"video": f"videos/{name}.mp4"}],
        "extra_info": {"answer": "A", "question_type": "mcq", "options": ["red", "green"]},
    }


@pytest.fixture
def bad_videos(tmp_path, needle_dir):
    """good (a real needle mp4), truncated (its first half), empty, one_frame, missing."""
    videos = tmp_path / "videos"
    videos.mkdir()
    source = sorted((needle_dir / "videos").glob("*.mp4"))[0]
    shutil.copy(source, videos / "good.mp4")
    data = source.read_bytes()
    (videos / "truncated.mp4").write_bytes(data[: len(data) // 2])
    (videos / "empty.mp4").write_bytes(b"")
    write_video(videos / "one_frame.mp4", [np.zeros((32, 32, 3), np.uint8)], fps=1.0)
    names = ["good", "truncated", "empty", "one_frame", "missing"]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(_row(n)) + "\n" for n in names))
    return path


@pytest.mark.parametrize("check", ["open", "decode"])
def test_undecodable_videos_are_skipped_counted_and_named(bad_videos, check, caplog):
    samples, report = load_samples(bad_videos, video_check=check)
    assert [s.id for s in samples] == ["good"]
    assert report.total == 5 and report.kept == 1 and report.video_errors == 4
    reasons = dict(report.skipped)
    assert sorted(reasons) == ["empty", "missing", "one_frame", "truncated"]
    for name, reason in reasons.items():
        assert f"{name}.mp4" in reason and "videos[0].video" in reason, reason
    assert "not found" in reasons["missing"] and ">= 2" in reasons["one_frame"]
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "skipped 4 of 5 rows (kept 1), 4 with a bad video" in warning


def test_the_default_check_only_looks_for_the_file(bad_videos):
    samples, report = load_samples(bad_videos)
    assert len(samples) == 4 and report.video_errors == 1  # only `missing`


def test_fail_fast_stops_on_the_first_bad_video_with_a_user_error(bad_videos):
    with pytest.raises(BadRowError, match=r"truncated\.mp4.*fail_fast") as caught:
        load_samples(bad_videos, video_check="open", fail_fast=True)
    assert isinstance(caught.value, UserError) and "\n" not in str(caught.value)


def test_an_unknown_video_check_is_refused(bad_videos):
    with pytest.raises(UserError, match="video_check"):
        load_samples(bad_videos, video_check="full")
