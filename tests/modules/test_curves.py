"""PNG curves are drawn from what the run logged to TensorBoard."""

from __future__ import annotations

import pytest


def test_curves_are_drawn_from_logged_scalars(tmp_path):
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter

    from paravt.run.curves import read_scalars, write_curves

    writer = SummaryWriter(str(tmp_path / "tb" / "version_0"))
    for step in range(5):
        writer.add_scalar("reward/mean", 0.1 * step, step)
        writer.add_scalar("f_tau", 0.9, step)
        writer.add_scalar("gate_ratio/K4", 1.0, step)
        writer.add_scalar("gate_ratio/K8", 0.5, step)
    writer.add_scalar("val/needle/accuracy", 0.3, 0)
    writer.add_scalar("val/needle/accuracy", 0.6, 4)
    writer.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["val/needle/accuracy"] == [(0, pytest.approx(0.3)), (4, pytest.approx(0.6))]
    paths = write_curves(tmp_path / "tb", tmp_path / "curves")
    assert [p.name for p in paths] == [
        "reward.png",
        "f_tau.png",
        "kappa.png",
        "heldout_accuracy.png",
        "gate_ratio.png",
    ]
    reward = Image.open(tmp_path / "curves" / "reward.png").convert("RGB")
    assert (31, 119, 180) in {c for _, c in reward.getcolors(1 << 16)}  # the series was drawn
    kappa = Image.open(tmp_path / "curves" / "kappa.png").convert("RGB")
    assert (31, 119, 180) not in {c for _, c in kappa.getcolors(1 << 16)}  # nothing logged
    gate = Image.open(tmp_path / "curves" / "gate_ratio.png").convert("RGB")
    colours = {c for _, c in gate.getcolors(1 << 16)}
    assert {(31, 119, 180), (214, 39, 40)} <= colours  # one series per budget


def test_compare_runs_draws_one_series_per_run(tmp_path):
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter

    from paravt.run.curves import compare_runs

    for name, value in (("a", 2.0), ("b", 0.5)):
        writer = SummaryWriter(str(tmp_path / name / "tb"))
        for step in range(3):
            writer.add_scalar("kappa", value, step)
        writer.close()
    runs = {"a": tmp_path / "a" / "tb", "b": tmp_path / "b" / "tb"}
    (path,) = compare_runs(runs, ["kappa"], tmp_path / "out", prefix="x_")
    assert path.name == "x_kappa.png"
    colours = {c for _, c in Image.open(path).convert("RGB").getcolors(1 << 16)}
    assert {(31, 119, 180), (214, 39, 40)} <= colours


def test_charts_have_ticks_span_the_run_and_keep_overlapping_series_visible(tmp_path):
    import numpy as np
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter

    from paravt.run.chart import LEFT, LEGEND_WIDTH, nice_ticks
    from paravt.run.curves import write_curves

    assert nice_ticks(0, 40, 8) == [0, 5, 10, 15, 20, 25, 30, 35, 40]
    assert nice_ticks(0.46, 1.04) == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert nice_ticks(0, 2, 8, integer=True) == [0, 1, 2]  # no step 0.5
    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(41):
        writer.add_scalar("reward/mean", 0.1 * step, step)
        if step <= 24:  # logged on part of the run only
            writer.add_scalar("gate_ratio/K2", 1.0, step)
            writer.add_scalar("gate_ratio/K4", 1.0, step)  # the same values: drawn over K2
    writer.close()
    write_curves(tmp_path / "tb", tmp_path / "curves")
    gate = np.asarray(Image.open(tmp_path / "curves" / "gate_ratio.png").convert("RGB"))
    plot = gate[:, : gate.shape[1] - LEGEND_WIDTH]
    blue, red = (plot == (31, 119, 180)).all(-1), (plot == (214, 39, 40)).all(-1)
    assert blue.sum() > 50 and red.sum() > 50  # K2 still shows around K4's line
    right = gate.shape[1] - LEGEND_WIDTH
    last = np.nonzero(blue.any(0))[0].max()
    # step 24 of 40 sits ~60% along the axis, not at its end
    assert last < LEFT + 0.7 * (right - LEFT), last
    legend = gate[:, right:]
    assert (legend == (214, 39, 40)).all(-1).sum() > 10  # the legend sits beside the plot
