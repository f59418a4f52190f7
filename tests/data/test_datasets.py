"""Loading real parquet / jsonl / json files into Samples, the load report, and epoch ordering."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from paravt.data.datasets import (
    DataFileError,
    LoadReport,
    epoch_order,
    load_rows,
    load_samples,
)
from paravt.data.schemas import sample_to_row

QUESTION = "What colour is the square?\nOptions:\nA. red\nB. green\nC. blue\nD. yellow"


def row(i: int, **extra_info) -> dict:
    return {
        "id": f"needle-train-{i:05d}",
        "data_source": "needle",
        "prompt": [{"role": "user", "content": f"<video>\n{QUESTION}"}],
        "videos": [{"video": f"videos/needle-train-{i:05d}.mp4"}],
        "extra_info": {
            "answer": "B",
            "question_type": "mcq",
            "options": ["red", "green", "blue", "yellow"],
            "windows": [[12.0, 15.0], [30, 31.5]],
            "family": "color",
            **extra_info,
        },
    }


@pytest.fixture
def data_dir(tmp_path):
    """A folder with dummy video files 0..4 (only their existence is checked)."""
    (tmp_path / "videos").mkdir()
    for i in range(5):
        (tmp_path / "videos" / f"needle-train-{i:05d}.mp4").write_bytes(b"\0")
    return tmp_path


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parquet_and_jsonl_give_the_same_samples(data_dir):
    rows = [row(0), row(1, hint="in the first half")]  # hint only in row 1: parquet fills None
    from_parquet, report = load_samples(write_parquet(data_dir / "train.parquet", rows))
    from_jsonl, _ = load_samples(write_jsonl(data_dir / "train.jsonl", rows))
    assert from_parquet == from_jsonl
    assert report == LoadReport(str(data_dir / "train.parquet"), total=2, kept=2, skipped=())
    first = from_parquet[0]
    assert first.video == str(data_dir / "videos" / "needle-train-00000.mp4")
    assert first.windows == ((12.0, 15.0), (30.0, 31.5))
    assert all(isinstance(t, float) for pair in first.windows for t in pair)
    assert first.options == ("red", "green", "blue", "yellow")
    assert first.extra == {"family": "color"}  # the parquet-filled hint=None is dropped
    assert from_parquet[1].extra == {"family": "color", "hint": "in the first half"}


def test_parquet_content_parts_prompt(data_dir):
    rows = []
    for i in range(2):
        r = row(i)
        r["prompt"] = [
            {"role": "system", "content": [{"type": "text", "text": "Use crop_video."}]},
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]},
        ]
        rows.append(r)
    samples, report = load_samples(write_parquet(data_dir / "parts.parquet", rows))
    assert report.kept == 2
    assert samples[0].question == QUESTION
    assert samples[0].extra["system_prompt"] == "Use crop_video."


def test_verl_parquet_with_absolute_video(data_dir):
    video = str(data_dir / "videos" / "needle-train-00003.mp4")
    rows = [
        {
            "data_source": "longvt",
            "prompt": [{"role": "user", "content": "<video>When does it turn red?"}],
            "videos": [{"video": video}],
            "reward_model": {"ground_truth": "[12.0, 15.0]", "style": "rule"},
            "extra_info": {"index": 11, "split": "train"},
        }
    ]
    (sample,), report = load_samples(write_parquet(data_dir / "verl.parquet", rows))
    assert (sample.id, sample.video, sample.question_type) == ("longvt-11", video, "tvg")
    assert sample.windows == ((12.0, 15.0),)
    assert report.skipped == ()


def test_json_list_file(data_dir):
    path = data_dir / "train.json"
    path.write_text(json.dumps([row(0), row(1)]))
    samples, _ = load_samples(path)
    assert [s.id for s in samples] == ["needle-train-00000", "needle-train-00001"]


def test_bad_rows_are_skipped_and_reported_by_id(data_dir, caplog):
    missing = row(9)  # videos/needle-train-00009.mp4 does not exist
    bad_windows = row(2, windows=[[15.0, 12.0]])
    no_id = row(3)
    del no_id["id"]
    no_id["extra_info"]["question_type"] = "yesno"
    rows = [row(0), missing, bad_windows, row(0), no_id, row(1)]
    path = write_jsonl(data_dir / "mixed.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="paravt.data.datasets"):
        samples, report = load_samples(path)
    assert [s.id for s in samples] == ["needle-train-00000", "needle-train-00001"]
    # 6 rows = 2 kept + 4 skipped
    assert (report.total, report.kept, len(report.skipped)) == (6, 2, 4)
    ids = [rid for rid, _ in report.skipped]
    assert ids == ["needle-train-00009", "needle-train-00002", "needle-train-00000", "needle-4"]
    reasons = [reason for _, reason in report.skipped]
    assert "videos[0].video" in reasons[0] and "not found" in reasons[0]
    assert "extra_info.windows[0]" in reasons[1]
    assert "duplicate id" in reasons[2]
    assert "question_type" in reasons[3] and "'yesno'" in reasons[3]
    (record,) = caplog.records
    assert "skipped 4 of 6 rows (kept 2)" in record.message
    assert "needle-train-00009" in record.message  # the first reasons are quoted


def test_check_videos_off_keeps_missing_video(data_dir):
    path = write_jsonl(data_dir / "train.jsonl", [row(9)])
    samples, report = load_samples(path, check_videos=False)
    assert report.kept == 1
    assert samples[0].video == str(data_dir / "videos" / "needle-train-00009.mp4")


def test_limit_counts_kept_samples(data_dir):
    path = write_jsonl(data_dir / "train.jsonl", [row(0), row(9), row(1), row(2), row(3)])
    samples, report = load_samples(path, limit=2)
    # rows 0 (kept), 9 (missing video, skipped), 1 (kept) -> stop: 3 rows examined
    assert [s.id[-1] for s in samples] == ["0", "1"]
    assert (report.total, report.kept, len(report.skipped)) == (3, 2, 1)
    assert load_samples(path, limit=0)[1].total == 0
    with pytest.raises(ValueError, match="limit"):
        load_samples(path, limit=-1)


def test_written_back_rows_load_identically(data_dir):
    samples, _ = load_samples(write_jsonl(data_dir / "a.jsonl", [row(0), row(1)]))
    rows = [sample_to_row(s, base_dir=data_dir) for s in samples]
    assert rows[0]["videos"] == [{"video": "videos/needle-train-00000.mp4"}]
    again, _ = load_samples(write_parquet(data_dir / "b.parquet", rows))
    assert again == samples


def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"id": "a"}\n\n{"id": "b", oops}\n')
    with pytest.raises(DataFileError, match=r"train\.jsonl:3: invalid JSON"):
        load_rows(path)  # line 2 is blank and skipped; line 3 is broken


def test_jsonl_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"id": "a"}\n[1, 2]\n')
    with pytest.raises(DataFileError, match=r"train\.jsonl:2: expected a JSON object"):
        load_rows(path)


def test_json_file_errors(tmp_path):
    not_list = tmp_path / "rows.json"
    not_list.write_text('{"id": "a"}')
    with pytest.raises(DataFileError, match=r"rows\.json: expected a JSON list"):
        load_rows(not_list)
    broken = tmp_path / "broken.json"
    broken.write_text('[\n{"id": "a"},\n{"id": }\n]')
    with pytest.raises(DataFileError, match=r"broken\.json:3: invalid JSON"):
        load_rows(broken)


def test_unknown_extension_missing_and_unreadable_files(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("id\n")
    with pytest.raises(DataFileError, match=r"train\.csv: unknown data file extension '\.csv'"):
        load_rows(csv)
    with pytest.raises(DataFileError, match=r"absent\.parquet: no such file"):
        load_rows(tmp_path / "absent.parquet")
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"definitely not parquet")
    with pytest.raises(DataFileError, match=r"corrupt\.parquet: cannot read as parquet"):
        load_rows(corrupt)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DataFileError, match=r"binary\.jsonl: cannot read as UTF-8"):
        load_rows(binary)


def test_parquet_rows_are_plain_python(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", [row(0)])
    (loaded,) = load_rows(path)
    assert loaded["extra_info"]["windows"] == [[12.0, 15.0], [30.0, 31.5]]
    assert isinstance(loaded["prompt"], list) and isinstance(loaded["prompt"][0], dict)


def test_epoch_order_is_deterministic_and_changes_per_epoch():
    first = epoch_order(50, epoch=0, seed=123, shuffle=True)
    assert first == epoch_order(50, epoch=0, seed=123, shuffle=True)
    assert sorted(first) == list(range(50)) and first != list(range(50))
    second = epoch_order(50, epoch=1, seed=123, shuffle=True)
    assert second != first and sorted(second) == list(range(50))
    # the generator is seeded with seed + epoch: (123, 1) and (124, 0) share a stream
    assert second == epoch_order(50, epoch=0, seed=124, shuffle=True)
    generator = torch.Generator().manual_seed(124)
    assert second == torch.randperm(50, generator=generator).tolist()


def test_epoch_order_without_shuffle_and_edge_sizes():
    assert epoch_order(4, epoch=7, seed=0, shuffle=False) == [0, 1, 2, 3]
    assert epoch_order(0, epoch=0, seed=0, shuffle=True) == []
    assert epoch_order(1, epoch=3, seed=5, shuffle=True) == [0]
    with pytest.raises(ValueError, match="num must be >= 0"):
        epoch_order(-1, epoch=0, seed=0, shuffle=True)


def test_an_unknown_layout_and_unusable_data_are_one_user_error(tmp_path, data_dir):
    """Before: an unknown layout skipped every row one by one and then failed with all of
    them in one ValueError; a bad `data.generate` value was NeedleConfig's bare ValueError; a
    file with no rows said `()`."""
    from paravt.data.prompt_datamodule import PromptDataModule
    from paravt.errors import UserError

    with pytest.raises(UserError, match=r"data\.layout='veRL': choose one of auto, paravt, verl"):
        load_samples(data_dir / "train.jsonl", layout="veRL")
    with pytest.raises(UserError, match=r"data\.layout='x'"):
        PromptDataModule(str(data_dir / "train.jsonl"), layout="x")
    out = tmp_path / "gen"
    bad = PromptDataModule(str(out / "train.jsonl"), generate={"out_dir": str(out), "hint": "x"})
    with pytest.raises(UserError, match=r"^data\.generate: NeedleConfig: hint must be one of"):
        bad.prepare_data()
    assert not out.exists()  # nothing was generated
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(UserError, match=r"empty\.jsonl: it has no rows$"):
        PromptDataModule(str(tmp_path / "empty.jsonl")).setup()
    (tmp_path / "bad.jsonl").write_text('{"prompt": 3}\n')
    with pytest.raises(UserError, match=r"all 1 rows were skipped \(first: row-0: "):
        PromptDataModule(str(tmp_path / "bad.jsonl")).setup()
