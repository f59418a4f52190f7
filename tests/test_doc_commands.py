"""Every command README.md and docs/*.md show runs as written, wherever it stands.

Commands are found in code blocks and inline code: `python train.py ...`, `python evaluate.py
...`, `paravt <tool> ...` (a `$ ` prompt and a trailing `# comment` are dropped; lines continued
with `\\` are joined; an inline span may wrap over lines). Placeholders (`NAME`, `DIR`, `FILE`,
`[--opt]`, a `...` for the reader's other overrides) are substituted with test values
(PLACEHOLDERS); the two patterns of SKIPPED are not composed, each for the reason given there.
Shell set-up lines (pip, git, tensorboard) are not commands of paravt and are not run. What each
kind gets:

- every `train.py` / `evaluate.py` command composes with its overrides as written (a sweep at its
  first values) and its light groups instantiate holding the config's values;
- GPU commands (a `/models/` or `/data/` path, `trainer.devices=8`, `model=qwen...`) are not
  run (no GPU): the training ones and every `paravt check-recipe` shown pass the recipe check
  with a memory plan, and each stands under a "GPU" label (a heading, table header or comment);
- the error examples of docs/training.md's "When something is wrong" are run and must print
  what the page shows (`test_the_error_examples_print_what_the_training_page_shows`); these and
  the CPU chain's commands are each a process of their own, forked from one interpreter that
  imported torch, transformers and Lightning once (tests/forkserver.py);
- the CPU chain of the SFT section and the evaluation row run for real, as written plus step
  and size caps, in one fresh folder with no `artifacts/` and no `runs/`, sharing their outputs
  like a user's shell would (`test_the_cpu_chain_runs_from_a_fresh_folder`); its SFT run (3
  steps) must log, schedule and export what the SFT stage promises, and RL continue from it.
  The CPU training commands of the tables run for one step in tests/test_readme.py;
- the vLLM commands (`rollout/engine=vllm`, `--engine vllm`) run the same way in the vLLM
  environment (marker `vllm`, `make test-vllm`): train, then evaluate and `paravt rollout` on
  the policy it exported, with no traceback even at exit
  (`test_the_vllm_commands_run_from_a_fresh_folder`). docs/evaluation.md's judge server command
  is started as written by tests/rewards/test_judge_vllm.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from tests import forkserver
from tests.configured import assert_built_as_configured

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(?:python (?:train|evaluate)\.py|paravt [a-z-]+)(?:\s|$)")
ENTRY = {"train.py": "train", "evaluate.py": "eval"}


# Placeholders the docs write for a value the reader picks, and the real value each command is
# composed with here: a run name, an exported policy folder, a data file, an optional flag taken,
# "your other overrides" left out.
PLACEHOLDERS = (
    (r"\bNAME\b", "demo"),
    (r"\bDIR\b", "runs/demo/hf"),
    (r"\bFILE\b", "artifacts/needle/eval.jsonl"),
    (r"\[(--[a-z-]+)\]", r"\1"),
    (r" \.\.\.(?= |$)", ""),
)
# The only commands shown that are not composed, each with its reason.
SKIPPED = {
    "python train.py -m ... trainer.devices=N": "training.md's multi-GPU sweep pattern: the sweep "
    "and N are the reader's; what a sweep child runs is tested in tests/test_launch_argv.py",
    "python evaluate.py rollout/engine=vllm benchmark=...": "engines.md's table names the group "
    "only; the whole command (benchmark=needle model.path=runs/demo/hf) is run by the vLLM chain",
}


def _substituted(command: str) -> str:
    for pattern, value in PLACEHOLDERS:
        command = re.sub(pattern, value, command)
    return command


def _joined(text: str) -> str:
    """Shell lines continued with a trailing `\\` joined into one."""
    return re.sub(r"\s*\\\n\s*", " ", text)


def _candidates(text: str) -> list[str]:
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in _joined(block).splitlines():  # `\` continuations joined
            found.append(line.strip().removeprefix("$ ").split("  #")[0].split(" # ")[0])
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return [c.strip() for c in found if COMMAND.match(c.strip())]


def doc_commands() -> list[tuple[str, str]]:
    """(page, command) for every command of README.md and docs/*.md, each once, placeholders
    substituted (the SKIPPED patterns as written)."""
    seen, out = set(), []
    for page in PAGES:
        for shown in _candidates(page.read_text()):
            command = shown if shown in SKIPPED else _substituted(shown)
            if command not in seen:
                seen.add(command)
                out.append((page.name, command))
    return out


COMMANDS = doc_commands()
ERRORS_PAGE, ERRORS_HEADING = ROOT / "docs" / "training.md", "## When something is wrong"


def _errors_section() -> str:
    """docs/training.md's "When something is wrong" section: the error examples."""
    text = ERRORS_PAGE.read_text()
    start = text.index(ERRORS_HEADING + "\n")
    end = text.find("\n## ", start + len(ERRORS_HEADING))
    return text[start : end if end > 0 else None]


ERRORS = set(_candidates(_errors_section()))


def is_gpu(command: str) -> bool:
    return bool(re.search(r"/models/|/data/|trainer\.devices=8|model=qwen", command))


def _overrides(command: str) -> list[str]:
    args = [a for a in shlex.split(command)[2:] if a not in ("-m", "--multirun")]
    out = []
    for arg in args:
        key, _, value = arg.partition("=")
        out.append(f"{key}={value.split(',')[0]}" if "," in value and "[" not in value else arg)
    return out


HYDRA = [c for _, c in COMMANDS if c.split()[1] in ENTRY and c not in ERRORS | SKIPPED.keys()]


def test_the_docs_show_commands_of_every_kind():
    assert len(HYDRA) >= 20, HYDRA
    assert any(is_gpu(c) for c in HYDRA) and any(not is_gpu(c) for c in HYDRA)
    assert {
        "python train.py experiment=demo_sft",
        "paravt make-sft-data --needle "
        "artifacts/needle/train.jsonl --model artifacts/tiny_qwen3_vl --out sft.jsonl",
    } <= {c for _, c in COMMANDS}


def test_the_commands_with_placeholders_and_continuations_are_composed():
    """README's tracker list, the real-vocabulary command and the evaluation sweep (a `\\`
    continued block) are composed; nothing else is left as a pattern."""
    assert {
        "python train.py logger=[tensorboard,wandb,mlflow]",
        "python train.py model.tiny.tokenizer=qwen "
        '\'algorithm.anchor_tags=["</think>","</tool_call>","<tool_call>"]\'',
        "python evaluate.py model.path=runs/demo/hf model.build_tiny=null",
        "python evaluate.py judge=openai",
    } <= set(HYDRA)
    sweeps = [c for c in HYDRA if c.startswith("python evaluate.py -m benchmark=needle mode=")]
    assert sweeps and all("model.path=runs/demo/hf" in c and "\\" not in c for c in sweeps)
    assert set(SKIPPED) <= {c for _, c in COMMANDS}  # each skip still stands in the docs
    patterns = [c for c in HYDRA if re.search(r"\.\.\.|\[--|\bNAME\b|\\$", c)]
    assert not patterns, patterns


@pytest.mark.parametrize("command", HYDRA, ids=lambda c: c[:80])
def test_each_command_composes_and_its_light_groups_instantiate(command, tmp_path):
    name = ENTRY[command.split()[1]]
    extra = [f"run_dir={tmp_path}"] if name == "train" else []
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(name, overrides=[*_overrides(command), *extra])
    assert_built_as_configured(instantiate(cfg.model), cfg.model, "model")
    for group in ("rollout", "algorithm", "reward"):
        if group in cfg and "_target_" in cfg[group]:
            assert_built_as_configured(instantiate(cfg[group]), cfg[group], group)
    if name == "train" and cfg.get("stage", "rl") == "rl":
        assert cfg.trainer.accelerator == ("gpu" if is_gpu(command) else "cpu"), command


# GPU training commands, and the `paravt check-recipe` commands shown, pass the recipe check
# (devices x nodes, batch split, engine context, a per-GPU memory plan from published sizes).
RECIPES = [c for c in HYDRA if is_gpu(c) and c.split()[1] == "train.py"]
RECIPES += [c for _, c in COMMANDS if c.startswith("paravt check-recipe")]


@pytest.mark.parametrize("command", RECIPES, ids=lambda c: c[:80])
def test_each_gpu_training_command_passes_check_recipe(command, capsys):
    from paravt.run.recipe import main

    code = main(shlex.split(command)[2:])
    out = capsys.readouterr().out
    assert code == 0 and "recipe OK" in out, f"{command}\n{out}"
    if is_gpu(command) and "experiment=sft" not in command:  # RL: the memory plan too
        assert "memory plan per GPU" in out, out


def _sections(text: str) -> list[str]:
    """The page cut at each heading (a `#` line, code comments included), whitespace joined."""
    return [
        " ".join(part.split()) for part in re.split(r"^(?=#+ [A-Za-z])", _joined(text), flags=re.M)
    ]


def test_every_gpu_command_is_labelled_gpu_where_it_stands():
    """A reader sees "GPU" between the heading above a GPU command and the command (a table's
    header, a code comment, the heading itself): nothing in the docs ran them (no GPU)."""
    gpu = [(p, c) for p, c in COMMANDS if is_gpu(c)]
    assert len(gpu) >= 10, gpu
    for page, command in gpu:
        flat = " ".join(command.split())
        sections = [s for p in PAGES if p.name == page for s in _sections(p.read_text())]
        where = [s[: s.index(flat)] for s in sections if flat in s]
        assert where and "GPU" in where[0], f"{page}: {command} is not labelled GPU"


def test_every_paravt_tool_shown_exists():
    from paravt.cli import main

    tools = {c.split()[1] for _, c in COMMANDS if c.startswith("paravt ")} - {"--help"}
    assert tools >= {"make-sft-data", "make-tiny-model", "make-needle-data", "rollout"}
    for tool in tools:  # argparse exits 0 after the help, or the tool returns 0
        try:
            code = main([tool, "--help"])
        except SystemExit as done:
            code = done.code
        assert code == 0, tool


def _shown_errors() -> list[tuple[str, list[str], int]]:
    """(command, the output lines shown, the exit code shown) of the error section's first
    block."""
    block = re.search(r"```\n(\$ .*?)```", _errors_section(), re.S).group(1)
    out = []
    for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
        lines = part.rstrip("\n").splitlines()
        code = int(re.fullmatch(r"\(exit (\d+)\)", lines[-1]).group(1))
        out.append((lines[0], [x for x in lines[1:-1] if x != "..."], code))
    return out


def _run(command: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """The command as a user's shell runs it in `cwd`, forked from an interpreter that imported
    torch, transformers and Lightning once (tests/forkserver.py): `python SCRIPT` runs the
    checkout's script as `__main__`, `paravt` the CLI module."""
    argv = shlex.split(command)
    logs = cwd.parent / f"{cwd.name}_logs"  # outside the folder the commands must find fresh
    if argv[0] == "python":
        return forkserver.run([str(ROOT / argv[1]), *argv[2:]], logs, cwd, timeout=timeout)
    code = forkserver.PARAVT_CLI
    return forkserver.run(["paravt", *argv[1:]], logs, cwd, timeout=timeout, code=code)


def _subprocess(command: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """The command in a fresh interpreter of its own (vLLM's engine is not forked from one that
    imported torch: its start-up is part of what the vLLM chain checks)."""
    argv = shlex.split(command)
    if argv[0] == "python":
        argv = [sys.executable, str(ROOT / argv[1]), *argv[2:]]
    else:
        argv = [sys.executable, "-m", "paravt.cli", *argv[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_error_examples_print_what_the_training_page_shows(tmp_path):
    """Each shown line appears in the real output, in order, with the shown exit code; on a
    mismatch the message holds the real output to paste into the page."""
    for command, shown, code in _shown_errors():
        result = _run(command, tmp_path, timeout=300)
        real = (result.stdout + result.stderr).splitlines()
        regenerated = "\n".join([f"$ {command}", *real, f"(exit {result.returncode})"])
        assert result.returncode == code, regenerated
        position = 0
        for line in shown:
            drifted = f"docs/training.md's error examples drifted; real output:\n{regenerated}"
            assert line in real[position:], drifted
            position = real.index(line, position) + 1


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A working folder with no artifacts/ and no runs/, shared by the chain's commands."""
    return tmp_path_factory.mktemp("fresh")


STEP_CAPS = {  # as written, plus caps that keep each command to a step or a few
    "python train.py experiment=demo_sft": "trainer.max_steps=3 data.generate.needle.num_train=4 "
    "data.generate.needle.num_eval=2",
    "python train.py model.path=runs/demo_sft/hf model.build_tiny=null cold_start=null": (
        "trainer.max_steps=1 data.batch_size=1 rollout.group_size=2 rollout.agent.max_rounds=1 "
        "rollout.agent.max_new_tokens=8 data.generate.num_train=4 data.generate.num_eval=2 "
        "callbacks.benchmark_validation.limit=1 callbacks.benchmark_validation.every_n_steps=1"
    ),
    "python evaluate.py model.path=runs/demo/hf model.build_tiny=null": "limit=1",
    "paravt make-sft-data --needle artifacts/needle/train.jsonl --model artifacts/tiny_qwen3_vl "
    "--out sft.jsonl": "",
}


@pytest.mark.slow
def test_the_cpu_chain_runs_from_a_fresh_folder(fresh):
    """The chain, and what its SFT -> RL commands must do: the SFT stage trains (its log,
    TensorBoard scalars and learning-rate schedule), exports trained weights, RL continues."""
    shown = {c for _, c in COMMANDS}
    assert set(STEP_CAPS) <= shown, set(STEP_CAPS) - shown
    assert not (fresh / "artifacts").exists() and not (fresh / "runs").exists()
    stdout = []
    for command, caps in STEP_CAPS.items():
        result = _run(f"{command} {caps}".strip(), fresh)
        assert result.returncode == 0, (
            command + "\n" + result.stdout[-2000:] + result.stderr[-3000:]
        )
        stdout.append(result.stdout)
    sft, rl = fresh / "runs" / "demo_sft", fresh / "runs" / "demo"
    assert (sft / "hf" / "config.json").exists()
    assert (rl / "hf" / "paravt_protocol.json").exists()
    assert (fresh / "sft.jsonl").read_text().count("\n") >= 1  # the teacher rows
    assert list((fresh / "runs" / "eval" / "needle" / "parallel").glob("*/metrics.json"))
    _assert_sft_trained_and_rl_continued(fresh, stdout[0], stdout[1])


def _assert_sft_trained_and_rl_continued(fresh: Path, sft_out: str, rl_out: str) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForImageTextToText

    sft = fresh / "runs" / "demo_sft"
    assert "paravt SFT run 'demo_sft' (3 optimiser steps)" in sft_out, sft_out
    log = (sft / "train.log").read_text()
    assert "SFT step 3/3" in log and "RL step" not in log, log
    acc = EventAccumulator(str(sft / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    wanted = {"train/loss", "train/answer_loss", "train/answer_accuracy", "train/lr"}
    assert wanted | {"train/tokens_per_s"} <= tags, tags
    lrs = [e.value for e in acc.Scalars("train/lr")]
    # warm-up of ceil(0.05 * 3) = 1 step (1/1 of the peak 3e-3), then cosine over the other 2
    assert lrs == pytest.approx([3e-3, 3e-3, 1.5e-3])
    assert "(1 RL steps)" in rl_out, rl_out
    # The SFT export holds trained weights (not the tiny model's), and RL ran from it.
    trained = AutoModelForImageTextToText.from_pretrained(sft / "hf")
    tiny = AutoModelForImageTextToText.from_pretrained(fresh / "artifacts" / "tiny_qwen3_vl")
    assert any(
        not torch.equal(p, q) for p, q in zip(trained.parameters(), tiny.parameters(), strict=True)
    )


# ---- the vLLM environment's commands (marker `vllm`: `make test-vllm` runs them in .venv-vllm)
VLLM = re.compile(r"rollout/engine=vllm\b|--engine vllm\b")  # not vllm_server
VLLM_CAPS = {  # as written, plus caps that keep each command to a step or two (docs/development.md)
    "python train.py rollout/engine=vllm": "trainer.max_steps=2 data.batch_size=1 "
    "rollout.group_size=2 rollout.agent.max_rounds=1 rollout.agent.max_new_tokens=8 "
    "data.generate.num_train=4 data.generate.num_eval=2 cold_start.steps=1 "
    "cold_start.oracle_steps=1 cold_start.batch_size=2 cold_start.eval_limit=2 "
    "cold_start.report_limit=2 cold_start.report_frame_budgets=[4] "
    "callbacks.benchmark_validation.limit=1 callbacks.benchmark_validation.every_n_steps=1",
    "python evaluate.py rollout/engine=vllm benchmark=needle model.path=runs/demo/hf": "limit=1",
    "paravt rollout --engine vllm --model runs/demo/hf --data artifacts/needle_demo/eval.jsonl": (
        "--num 1 --group 2 --frame-budget 4 --rounds 1 --max-new-tokens 16"
    ),
}


def test_every_vllm_command_shown_is_run_by_the_vllm_chain():
    shown = {c for _, c in COMMANDS if VLLM.search(c) and c not in SKIPPED}
    assert shown == set(VLLM_CAPS), shown ^ set(VLLM_CAPS)


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_the_vllm_commands_run_from_a_fresh_folder(tmp_path):
    """The three commands of docs/engines.md in one fresh folder, in order (the training run
    makes the tiny model, the needle data and runs/demo/hf the other two use)."""
    outputs = {}
    for command, caps in VLLM_CAPS.items():
        result = _subprocess(f"{command} {caps}", tmp_path)
        out = result.stdout + result.stderr
        assert result.returncode == 0, command + "\n" + out[-4000:]
        assert "Traceback" not in out, command + "\n" + out[-4000:]  # not even at exit
        outputs[command.split()[1]] = result.stdout
    assert (tmp_path / "runs" / "demo" / "hf" / "paravt_protocol.json").exists()
    (metrics,) = (tmp_path / "runs" / "eval" / "needle" / "parallel").glob("*/metrics.json")
    assert json.loads(metrics.read_text())["run"]["engine"] == "vllm"
    assert outputs["rollout"].count("=== sample ") == 2  # 1 sample x 2 rollouts printed
