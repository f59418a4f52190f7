"""`logger=[...]`: 2 steps of the tiny demo through `train.py` with TensorBoard, CSV, W&B (offline)
and MLflow (file store) at once; each tracker's step metrics are read back from what it wrote and
agree, and each holds the run's name, config and git revision."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from paravt.errors import UserError
from paravt.run.loggers import build_loggers, git_revision, run_record

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("reward/mean", "loss/loss", "grad_norm")


def read_wandb_records(path: Path) -> list:
    """Every protobuf record of a `.wandb` file: wandb's LevelDB-style log of 32 KiB blocks, a
    7-byte file header (`:W&B`, magic, version), each chunk `crc32 u32, length u16, type u8`
    (1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, records, pending = path.read_bytes(), 7, [], b""
    assert raw[:4] == b":W&B", raw[:7]
    while pos + 7 <= len(raw):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        pending += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(records) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in records:
        if r.WhichOneof("record_type") != "history":
            continue
        row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for k in KEYS:
            if k in row:
                out.setdefault(k, {})[int(row["trainer/global_step"])] = float(row[k])
    return out


def csv_history(path: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            for k in KEYS:
                if row.get(k):
                    out.setdefault(k, {})[int(row["step"])] = float(row[k])
    return out


@pytest.mark.slow
def test_two_steps_reach_every_tracker(tmp_path, tiny_run_overrides, monkeypatch):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    env |= {"WANDB_CONFIG_DIR": str(tmp_path / "wcfg"), "WANDB_CACHE_DIR": str(tmp_path / "wc")}
    command = [
        sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", "name=tracked",
        "cold_start=null", "export_hf=false", *tiny_run_overrides, "trainer.max_steps=2",
        "rollout.agent.max_new_tokens=8", "rollout.agent.max_rounds=1",
        "callbacks.benchmark_validation.limit=1", "callbacks.rollout_logger.every_n_steps=1",
        "logger=[tensorboard,csv,wandb,mlflow]",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    by_csv = csv_history(run_dir / "csv" / "metrics.csv")
    assert sorted(by_csv["reward/mean"]) == [0, 1]  # Lightning's step of the 2 updates
    tb = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    tb.Reload()
    (wandb_file,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    records = read_wandb_records(Path(wandb_file))
    by_wandb = wandb_history(records)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{run_dir}/mlruns")
    (run,) = client.search_runs([client.get_experiment_by_name("paravt").experiment_id])
    for key in KEYS:
        board = {e.step: e.value for e in tb.Scalars(key)}
        # the file store's names: `.` for `/` (paravt.run.loggers.FileSafeMLFlowLogger)
        history = client.get_metric_history(run.info.run_id, key.replace("/", "."))
        flow = {m.step: m.value for m in history}
        assert sorted(by_csv[key]) == [0, 1], key
        for other in (by_wandb[key], flow, board):
            assert other == pytest.approx(by_csv[key]), key

    # run name, config and git revision in each
    revision = git_revision(ROOT) or "unknown"
    assert run.info.run_name == "tracked"
    assert run.data.params["git_revision"] == revision
    assert run.data.params["rollout/group_size"] == "2"
    assert run.data.tags["mlflow.source.git.commit"] == revision
    config = [r.config for r in records if r.WhichOneof("record_type") == "config"]
    updates = {u.key: json.loads(u.value_json) for c in config for u in c.update}
    assert updates["run_name"] == "tracked" and updates["git_revision"] == revision
    assert updates["rollout"]["group_size"] == 2
    assert "git_revision: " + revision in (run_dir / "csv" / "hparams.yaml").read_text()
    # texts and the crop timeline: W&B tables/images, MLflow artifacts, TensorBoard as before
    media = run_dir / "wandb" / "latest-run" / "files" / "media"
    (table, *_) = sorted(media.glob("table/rollouts/trajectory_0_*.table.json"))
    assert "### sample" in json.loads(table.read_text())["data"][0][0]
    assert list(media.glob("images/rollouts/crop_timeline_*.png"))
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "rollouts")}
    assert {"rollouts/trajectory_0", "rollouts/crop_timeline"} <= artifacts
    stored = Path(urlparse(run.info.artifact_uri).path) / "rollouts"
    assert "### sample" in next((stored / "trajectory_0").glob("step_*.md")).read_text()
    assert next((stored / "crop_timeline").glob("step_*.png")).stat().st_size > 0
    assert tb.Tags()["tensors"], "TensorBoard lost the trajectory texts"


def _compose(overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_logger_group_composes_alone_and_combined(tmp_path):
    single = build_loggers(_compose([f"run_dir={tmp_path}"]))
    assert [type(x).__name__ for x in single] == ["TensorBoardLogger"]
    both = build_loggers(_compose([f"run_dir={tmp_path}", "logger=[csv,tensorboard]"]))
    assert sorted(type(x).__name__ for x in both) == ["CSVLogger", "TensorBoardLogger"]
    assert build_loggers(_compose([f"run_dir={tmp_path}", "~logger"])) is False


def test_a_missing_tracker_package_names_the_install(tmp_path):
    cfg = _compose([f"run_dir={tmp_path}", "logger=wandb", "logger.wandb._target_=no_wandb.X"])
    with pytest.raises(UserError, match=r"logger=wandb needs the `wandb` package: pip install"):
        build_loggers(cfg)


def test_run_record_holds_name_revision_and_config(tmp_path):
    record = run_record(_compose([f"run_dir={tmp_path}", "name=abc"]))
    assert record["run_name"] == "abc" and record["run_dir"] == str(tmp_path)
    assert record["git_revision"] == (git_revision(ROOT) or "unknown")
    assert record["rollout"]["group_size"] == 4  # conf/experiment/demo.yaml
    assert git_revision(tmp_path) is None  # not a checkout
