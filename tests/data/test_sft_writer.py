"""The needle SFT writer's front doors refuse the former name of the frame budgets, naming the
new one, before any data is generated or any model is read."""

from __future__ import annotations

import pytest

from paravt.data.sft_writer import main, write_needle_sft_from_config


def test_the_former_generate_key_is_refused_naming_the_new_one(tmp_path):
    with pytest.raises(ValueError, match=r"data\.generate\.budgets is now .*frame_budgets"):
        write_needle_sft_from_config(str(tmp_path / "sft.jsonl"), "no-model", {"budgets": [4, 8]})
    assert not (tmp_path / "needle").exists()  # refused before generating the needle data


@pytest.mark.parametrize("flag", [["--budgets", "4,8"], ["--budgets=4,8"]])
def test_the_former_cli_flag_is_refused_naming_the_new_one(tmp_path, capsys, flag):
    argv = ["--needle", "x.jsonl", "--model", "m", "--out", str(tmp_path / "o.jsonl"), *flag]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "--budgets is now --frame-budgets" in capsys.readouterr().err
