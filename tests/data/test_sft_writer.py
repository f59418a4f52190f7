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


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"--needle": "missing.jsonl"}, "--needle {tmp}/missing.jsonl: no such file"),
        ({"--model": "nomodel"}, "--model {tmp}/nomodel: no such folder"),
        ({"--frame-budgets": "4,0"}, "expected integers >= 1 such as 4,8 (got '4,0')"),
        ({"--frame-budgets": "x"}, "expected integers >= 1 such as 4,8 (got 'x')"),
        ({"--max-rounds": "-1"}, "--max-rounds must be >= 0 (got -1)"),
    ],
)
def test_flags_it_cannot_use_are_one_usage_error(tmp_path, capsys, change, said):
    """Before: tracebacks (a DataFileError, the hub's repo-id OSError for a missing model
    folder, `int('x')`, uniform_indices' k >= 1) after the model was read."""
    (tmp_path / "rows.jsonl").write_text("{}\n")
    (tmp_path / "model").mkdir()
    paths = {"--needle": "rows.jsonl", "--model": "model", "--out": "o.jsonl"}
    flags = {k: str(tmp_path / v) for k, v in paths.items()}
    flags |= {k: str(tmp_path / v) if k in paths else v for k, v in change.items()}
    argv = [x for pair in flags.items() for x in pair]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert said.format(tmp=tmp_path) in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
