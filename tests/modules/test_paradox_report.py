"""`paravt paradox-report` on small synthetic run folders (real TensorBoard event files)."""

from __future__ import annotations

import math

import pytest


def _run(
    root,
    name: str,
    f_tau: list[float],
    kappa: list[float],
    reversion: float = 0.0,
    ruler=True,
    accuracy: float = 0.5,
):
    from torch.utils.tensorboard import SummaryWriter

    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(f"seed: 0\nname: {name}\nrun_dir: x\n")
    writer = SummaryWriter(str(run / "tb" / "version_0"))
    for step, (f, k) in enumerate(zip(f_tau, kappa, strict=True), start=1):
        if ruler:  # a run logged before the one ruler existed has f_tau alone
            writer.add_scalar("f_tau_ruler", f, step)
            writer.add_scalar("f_tau_anchor", 0.7, step)
            writer.add_scalar("tag_reversion", reversion, step)
        writer.add_scalar("f_tau", min(1.0, f + 0.2), step)  # the arm's own R_fmt
        writer.add_scalar("kappa", k, step)
        writer.add_scalar("drift/dropped_any", 0.5 * reversion, step)
        writer.add_scalar("reward/accuracy", accuracy, step)
    writer.close()
    return run


def test_arm_name_and_mean_se(tmp_path):
    from paravt.run.paradox_report import arm_name, mean_se

    run = tmp_path / "whatever"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("name: demo_prior_weak_seed${seed}  # one run\n")
    assert arm_name(run) == "weak"

    assert arm_name("runs/demo_prior_no_tool_reward_seed12") == "no_tool_reward"
    assert arm_name("somewhere/custom_arm") == "custom_arm"
    # Hydra saves the config unresolved: the name still holds ${seed}
    mean, se = mean_se([1.0, 2.0, 3.0])
    # sample std 1, se = 1 / sqrt(3)
    assert (mean, se) == (pytest.approx(2.0), pytest.approx(1 / math.sqrt(3)))
    assert mean_se([0.4]) == (0.4, 0.0)
    assert all(math.isnan(v) for v in mean_se([]))


def test_report_table_and_figure(tmp_path, capsys):
    from PIL import Image

    from paravt.run.paradox_report import main

    runs = [
        # vanilla GRPO: kappa collapses, one seed reverts tags
        _run(tmp_path, "demo_prior_grpo_seed0", [0.5, 0.6, 0.6, 0.6], [2.0, 1.0, 0.0, 0.0], 0.25),
        _run(
            tmp_path,
            "demo_prior_grpo_seed1",
            [0.5, 0.7, 0.8, 0.8],
            [2.0, 1.0, 1.0, 0.0],
            0,
            True,
            1,
        ),
        _run(tmp_path, "demo_prior_paragrpo_seed0", [0.5, 0.9, 0.9, 0.9], [2.0] * 4, ruler=False),
    ]
    out = tmp_path / "fig.png"
    assert main([*map(str, runs), "--out", str(out), "--last", "2"]) == 0
    text = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("|")}
    # cold start: first steps of all three runs: ruler 0.5 (the two that logged it), kappa 2.0
    assert "| 3 | 0.13 | 0.500 +- 0.000 | 2.50 | 2.000 +- 0.000 |" in rows["after cold start"]
    # GRPO, last 2 steps: seed means f_tau 0.6 and 0.8 -> 0.7 +- 0.1; kappa 0 and 0.5 -> 0.25
    grpo = rows["vanilla GRPO"]
    assert "| 2 | 0.13 | 0.700 +- 0.100 | 0.02 | 0.250 +- 0.250 |" in grpo
    # tag reversion 0.25 and 0 over the two seeds; own R_fmt 0.8 and 1.0; anchor term 0.7
    assert "| 0.125 +- 0.125 | 0.900 +- 0.100 | 0.700 +- 0.000 |" in grpo
    assert grpo.endswith("| 0.750 +- 0.250 |")  # accuracy 0.5 and 1.0 over the two seeds
    # a run without the ruler: its own R_fmt is shown, the ruler is not made up
    assert (
        "| 1 | 0.41 | n/a | 0.21 | 2.000 +- 0.000 | n/a | 1.000 +- 0.000 | n/a |"
        in rows["PARA-GRPO"]
    )
    assert "weak prior" not in text  # only arms that ran get a row
    img = Image.open(out)
    assert img.size == (1280, 400)  # two 640 x 400 panels
    # the two panels are drawn: some non-white pixels in each half
    left = img.crop((0, 0, img.size[0] // 2, img.size[1])).convert("L")
    right = img.crop((img.size[0] // 2, 0, img.size[0], img.size[1])).convert("L")
    assert left.getextrema()[0] < 200 and right.getextrema()[0] < 200


def test_report_refuses_a_folder_without_training_scalars(tmp_path):
    from paravt.run.paradox_report import load_runs

    (tmp_path / "empty_seed0").mkdir()
    with pytest.raises(SystemExit, match="logged no f_tau"):
        load_runs([tmp_path / "empty_seed0"])
    with pytest.raises(SystemExit, match="is not a run folder"):
        load_runs([tmp_path / "missing"])


def test_series_and_tail_reductions():
    from paravt.run.paradox_report import arm_series, tail_mean

    assert tail_mean([(3, 1.0), (1, 5.0), (2, 3.0)], 2) == pytest.approx(2.0)
    assert math.isnan(tail_mean([], 3))
    series = arm_series([[(1, 1.0), (2, 2.0)], [(1, 3.0)]])
    assert series[0] == (1, pytest.approx(2.0), pytest.approx(1.0))
    assert series[1] == (2, 2.0, 0.0)  # only one seed logged step 2


def test_the_factorial_prints_grouped_with_the_paper_rows_beside(tmp_path, capsys):
    from paravt.run.paradox_report import main

    runs = [
        _run(tmp_path, "demo_prior_grpo_gating_seed0", [0.4, 0.4], [2.0, 0.0]),
        _run(tmp_path, "demo_prior_grpo_gating_seed1", [0.4, 0.4], [2.0, 1.0]),
        _run(tmp_path, "demo_prior_grpo_anchor_seed0", [0.4, 0.4], [2.0, 0.0]),
        _run(tmp_path, "demo_prior_grpo_think_suffix_seed0", [0.6, 0.9], [2.0, 2.0]),
        _run(tmp_path, "demo_prior_gating_only_seed0", [0.6, 0.9], [2.0, 1.5]),
        _run(tmp_path, "demo_prior_custom_seed0", [0.5, 0.5], [1.0, 1.0]),
    ]
    assert main([*map(str, runs), "--out", str(tmp_path / "f.png"), "--last", "1"]) == 0
    text = capsys.readouterr().out
    titles = [line for line in text.splitlines() if line.startswith("**")]
    # the groups that ran, in the order (no group for the absent weak prior), then
    # the arm outside the factorial
    first_words = [t.split()[0] for t in titles]
    assert first_words == ["**before", "**vanilla", "**prompt", "**PARA-GRPO's", "**other"]
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("|")}
    # vanilla + gating beside the paper's gating only (f_tau 0.10, kappa 1.36); last step of
    # each seed: kappa 0 and 1 -> 0.5 +- 0.5, f_tau 0.4 on both
    gating = "| budget gating only | 2 | 0.10 | 0.400 +- 0.000 | 1.36 | 0.500 +- 0.500 |"
    assert gating in rows["vanilla + frame-budget gating"]
    assert (
        "| anchoring only | 1 | 0.35 | 0.400 +- 0.000 | 0.19 | 0.000 +- 0.000 |"
        in (rows["vanilla + structural anchor"])
    )
    # a prompt control has no paper row: its paper cells stay empty
    control = rows["vanilla + forced `<think>` + answer-suffix credits"]
    assert control.startswith(
        "| vanilla + forced `<think>` + answer-suffix credits |  | 1 |  | 0.900 +- 0.000 |  |"
    )
    # PARA-GRPO's prompt keeps its gating-only arm, with the same paper row
    para_gating = "| budget gating only | budget gating only | 1 | 0.10 | 0.900"
    assert para_gating in rows["budget gating only"]
    assert "| custom |  | 1 |  |" in rows["custom"]  # an arm outside the factorial: its own name
    # the vanilla group lists its arms in the factorial's order: anchor before gating
    assert text.index("vanilla + structural anchor") < text.index("vanilla + frame-budget gating")
