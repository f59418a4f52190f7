"""Finding 7: under W ranks the training videos are opened once (by rank 0), not W times."""

from __future__ import annotations

import pytest

from .launch import launch

pytestmark = pytest.mark.slow


def test_rank0_opens_the_videos_and_every_rank_gets_its_result(needle_dir, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(needle_dir, data)
    args = ["setup_once", str(data / "train.jsonl"), str(tmp_path / "out")]
    rank0, rank1 = launch(args, tmp_path / "out", world_size=2, timeout=300)
    assert rank0["opened"] == len(rank0["ids"]) == 4 and rank1["opened"] == 0
    assert rank1["ids"] == rank0["ids"] and rank1["report"] == rank0["report"]
    assert rank0["error"] == rank1["error"] == "DataFileError"  # rank 0's error, on both
