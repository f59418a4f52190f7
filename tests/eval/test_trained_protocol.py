"""An exported paravt policy carries its training protocol, and evaluate.py uses it.

Unit checks of `paravt.eval.trained_protocol` on the composed demo config, then the user's path:
`train.py` for 2 steps in an empty folder, and `python evaluate.py model.path=runs/NAME/hf
model.build_tiny=null` (README's "evaluate the demo's exported policy" row, with this run's name),
which must evaluate with the compact prompt, crops and frame budget the policy trained with.
"""

from __future__ import annotations

import glob
import json
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from paravt.eval.trained_protocol import (
    FILE_NAME,
    override_keys,
    protocol_of_training,
    read_protocol,
    trained_settings,
    write_protocol,
)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]


def _demo_record(tmp_path, *overrides: str) -> dict:
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"run_dir={tmp_path}", *overrides])
    plain = {
        "name": cfg.name,
        "rollout": OmegaConf.to_container(cfg.rollout, resolve=True),
        "data": OmegaConf.to_container(cfg.data, resolve=True),
        "callbacks": {
            k: OmegaConf.to_container(cfg.callbacks[k], resolve=True)
            for k in ("frame_budget_gating", "benchmark_validation")
        },
    }
    return protocol_of_training(plain)


def test_the_demo_record_names_its_prompt_crops_budgets_and_eval_split(tmp_path):
    record = _demo_record(tmp_path)
    s = record["settings"]
    assert s["rollout.agent.system"] == "compact" and s["rollout.agent.max_rounds"] == 2
    assert s["rollout.crop.max_frames"] == 8 and s["rollout.crop.sample_fps"] == 0.5
    assert s["protocol.frame_budget"] == 4 and record["frame_budgets"] == [2, 4]
    assert record["needle_annotations"] == "artifacts/needle_demo/eval.jsonl"
    write_protocol(tmp_path, record)
    assert read_protocol(str(tmp_path)) == json.loads(json.dumps(record))


def test_the_tool_dialect_trained_with_reaches_the_evaluation(tmp_path):
    default = _demo_record(tmp_path)["settings"]
    assert default["rollout.agent.tool_dialect"] == "any"
    record = _demo_record(tmp_path, "experiment=demo_prior_paragrpo")
    applied, kept = trained_settings(record, "parallel", "needle", set())
    assert applied["rollout.agent.tool_dialect"] == "tool_call" and kept == []
    given = override_keys(["rollout.agent.tool_dialect=any"])
    applied, kept = trained_settings(record, "parallel", "needle", given)
    assert "rollout.agent.tool_dialect" not in applied
    assert kept == ["rollout.agent.tool_dialect"]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("eval", overrides=["rollout.agent.tool_dialect=tool_call"])
    assert cfg.rollout.agent.tool_dialect == "tool_call"  # a key conf/eval.yaml has


def test_the_mode_and_the_command_line_win_over_the_trained_protocol(tmp_path):
    record = _demo_record(tmp_path)
    given = override_keys(["+rollout.agent.max_new_tokens=99", "mode=tools_denied"])
    applied, kept = trained_settings(record, "tools_denied", "needle", given)
    assert kept == ["rollout.agent.max_new_tokens"]
    assert "rollout.agent.max_new_tokens" not in applied
    # tools_denied sets its own rounds and call cap; the prompt and crops are still training's
    assert "rollout.agent.max_rounds" not in applied
    assert "rollout.crop.max_calls_per_turn" not in applied
    assert applied["rollout.agent.system"] == "compact"
    assert applied["benchmark.annotations"] == "artifacts/needle_demo/eval.jsonl"
    applied, _ = trained_settings(record, "parallel", "videomme", set())
    assert applied["rollout.agent.max_rounds"] == 2 and "benchmark.annotations" not in applied


def test_a_torn_protocol_file_is_one_clear_error(tmp_path):
    (tmp_path / FILE_NAME).write_text('{"settings": ')
    with pytest.raises(ValueError, match="trained_protocol=false"):
        read_protocol(str(tmp_path))


def test_a_record_written_before_the_frame_budget_rename_still_applies(tmp_path):
    settings = {"protocol.num_frames": 4, "rollout.agent.max_rounds": 2}
    (tmp_path / FILE_NAME).write_text(json.dumps({"settings": settings}))
    applied, _ = trained_settings(read_protocol(str(tmp_path)), "parallel", "videomme", set())
    assert applied == {"protocol.frame_budget": 4, "rollout.agent.max_rounds": 2}


def _run(script: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python SCRIPT *args` in `cwd`, forked from a preloaded interpreter (tests/forkserver.py)."""
    return forkserver.run([str(ROOT / script), *args], cwd.parent / f"{cwd.name}_logs", cwd)


@pytest.mark.slow
def test_evaluate_on_an_exported_policy_uses_the_protocol_it_trained_with(
    tmp_path, tiny_run_overrides, needle_dir
):
    train = _run(
        "train.py",
        tmp_path,
        "name=tiny",
        "cold_start=null",
        *tiny_run_overrides,
        "trainer.max_steps=2",
        "rollout.agent.system=compact",
        "rollout.agent.max_rounds=1",
        "rollout.agent.max_new_tokens=8",
        "rollout.crop.max_frames=6",
        "callbacks.frame_budget_gating.frame_budgets=[2,4]",
        "callbacks.benchmark_validation.limit=1",
        "callbacks.benchmark_validation.every_n_steps=2",
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert (tmp_path / "runs" / "tiny" / "hf" / FILE_NAME).exists()
    out = _run("evaluate.py", tmp_path, "model.path=runs/tiny/hf", "model.build_tiny=null")
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "protocol: the one runs/tiny/hf was trained with" in text, text[-3000:]
    assert "\r" not in text  # progress as log lines, no carriage-return bar
    (config,) = glob.glob(str(tmp_path / "runs/eval/needle/parallel/*/run_config.json"))
    used = json.loads(Path(config).read_text())
    protocol = used["protocol"]
    assert protocol["frame_budget"] == 4 and protocol["crop"]["max_frames"] == 6
    assert protocol["agent"]["max_rounds"] == 1 and protocol["agent"]["system"] == "compact"
    assert used["annotations"] == str(needle_dir / "eval.jsonl")  # the split it validated on
