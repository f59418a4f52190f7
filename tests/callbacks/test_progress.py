"""Progress lines count global steps (resume-safe) and Lightning's records print once."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import torch

from paravt.callbacks.progress import StepProgress, route_lightning_logs
from paravt.progress import format_duration, progress_line, track


def test_progress_line_after_a_resume_counts_global_steps_and_this_runs_speed():
    # Resumed at step 6 of 20, 2 fresh steps in 5 s: 2.5 s/it, 12 steps left -> 30 s.
    line = progress_line("RL step", 8, 20, 5.0, 2, {"reward": 0.4125})
    assert line == "RL step 8/20 | 2.5 s/it | ETA 0:30 | reward 0.412"
    # Fast items read as items per second, never as "0.0 s/it".
    fast = progress_line("needle train videos", 32, 256, 1.0, 32, {})
    assert fast == "needle train videos 32/256 | 32.0 it/s | ETA 0:07"
    assert progress_line("gen", 0, None, 0.0, 0, {}) == "gen 0"
    assert format_duration(3723) == "1:02:03" and format_duration(59.6) == "1:00"


def test_track_logs_counts_when_not_on_a_terminal(caplog):
    with caplog.at_level(logging.INFO, logger="paravt.progress"):
        assert list(track(range(4), desc="teacher", every=2)) == [0, 1, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" |")[0] for line in lines] == ["teacher 2/4", "teacher 4/4"]


def test_track_keeps_one_unit_and_a_smoothed_rate_when_the_speed_changes(caplog):
    """Items at ~0.02 s then ~0.4 s each: the unit chosen at the first line (it/s) stays, and the
    rate follows the recent intervals (an EMA), not the run's first speed."""
    import time

    def items():
        for i in range(12):
            time.sleep(0.02 if i < 4 else 0.4)
            yield i

    with caplog.at_level(logging.INFO, logger="paravt.progress"):
        assert list(track(items(), total=12, desc="steps", every=4)) == list(range(12))
    lines = [r.getMessage() for r in caplog.records]
    rates = [float(line.split(" | ")[1].split()[0]) for line in lines]
    assert all(line.split(" | ")[1].endswith("it/s") for line in lines), lines
    assert rates[0] > 10 and rates[-1] < 5, rates  # the slowdown shows, in the same unit
    assert lines[-1].endswith("ETA 0:00")


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.w(batch).pow(2).mean()
        self.log("reward", -loss.detach())
        return loss

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_step_progress_logs_one_line_per_step_with_the_true_total(tmp_path, caplog):
    trainer = pl.Trainer(
        max_steps=6, callbacks=[StepProgress(metrics=["reward"])], logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="paravt.progress"):
        trainer.fit(_Tiny())
    lines = [r.getMessage() for r in caplog.records if r.name == "paravt.progress"]
    assert [line.split(" |")[0] for line in lines] == [f"RL step {i}/6" for i in range(1, 7)]
    assert all("ETA" in line and "reward" in line for line in lines)


def test_lightning_records_print_once_and_without_the_cloud_advert(capsys):
    root = logging.getLogger()
    handler = logging.StreamHandler()  # stands in for Hydra's console handler
    root.addHandler(handler)
    try:
        route_lightning_logs()
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        rank_zero_info("hello once")
        rank_zero_info("Tip: try installing [litlogger](https://pypi.org/project/litlogger/)")
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.count("hello once") == 1 and "litlogger" not in err


def test_after_a_resume_the_count_continues_from_the_checkpoint(tmp_path, caplog):
    from lightning.pytorch.callbacks import ModelCheckpoint

    def trainer(max_steps):
        ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
        return pl.Trainer(
            max_steps=max_steps, callbacks=[StepProgress(metrics=["reward"]), ckpt],
            logger=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=tmp_path,
        )  # fmt: skip

    trainer(2).fit(_Tiny())
    with caplog.at_level(logging.INFO, logger="paravt.progress"):
        trainer(4).fit(_Tiny(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    lines = [r.getMessage() for r in caplog.records if r.name == "paravt.progress"]
    assert [line.split(" |")[0] for line in lines] == ["RL step 3/4", "RL step 4/4"]
