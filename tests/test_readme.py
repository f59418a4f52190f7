"""Every command in the README's tables runs as written on the machine its table names.

The tables under the README's "## Commands" and docs/training.md's "## Ablations" are parsed
(the commands elsewhere in README and docs: tests/test_doc_commands.py): a cell holding
`python train.py ...` or `python evaluate.py ...` is a command; its machine is the row's
`machine` cell or, failing that, the column's header ("8 GPUs", "CPU ..."). GPU commands are
composed and every part that can be built without a GPU is instantiated (model spec, rollout,
algorithm, reward, optimizer, FSDP strategy). CPU commands are composed as written, pass
train.py's pre-flight path check, and are then run for one RL step (one cold-start step) on the
test run's tiny model and needle data.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from tests.configured import assert_built_as_configured

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TRAINING = (ROOT / "docs" / "training.md").read_text()
# (document, table heading): the README's commands table and the ablations table of the docs
TABLE_SECTIONS = ((README, "## Commands"), (TRAINING, "## Ablations"))
ENTRY_CONFIG = {"train.py": "train", "evaluate.py": "eval"}
# Scale a composed CPU config down to one step; only keys the config already has are set.
ONE_STEP = {
    "trainer.max_steps": 1,
    "data.batch_size": 1,
    "rollout.group_size": 2,
    "rollout.agent.max_rounds": 1,
    "rollout.agent.max_new_tokens": 12,
    "callbacks.benchmark_validation.limit": 1,
    "callbacks.benchmark_validation.every_n_steps": 1,
    "callbacks.rollout_logger.every_n_steps": 1,
    "cold_start.steps": 1,
    "cold_start.batch_size": 2,
    "export_hf": False,
}


@dataclass(frozen=True)
class Command:
    text: str
    machine: str  # "cpu" | "gpu"

    @property
    def script(self) -> str:
        return shlex.split(self.text)[1]

    @property
    def overrides(self) -> list[str]:
        """The command's overrides; a multirun sweep `k=a,b` is taken at its first value."""
        args = [a for a in shlex.split(self.text)[2:] if a not in ("-m", "--multirun")]
        return [_first_sweep_value(a) for a in args]


def _first_sweep_value(arg: str) -> str:
    key, _, value = arg.partition("=")
    if "," in value and not re.search(r"[\[\]{}()]", value):
        return f"{key}={value.split(',')[0]}"
    return arg


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end > 0 else None]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _machine(label: str) -> str | None:
    label = label.lower()
    return "gpu" if "gpu" in label else "cpu" if "cpu" in label else None


def readme_commands() -> list[Command]:
    found = []
    for text, heading in TABLE_SECTIONS:
        rows = [line for line in _section(text, heading).splitlines() if line.startswith("|")]
        header = [c.lower() for c in _cells(rows[0])]
        for row in rows[2:]:
            cells = _cells(row)
            row_machine = _machine(cells[header.index("machine")]) if "machine" in header else None
            for column, cell in zip(header, cells, strict=True):
                for code in re.findall(r"`(python (?:train|evaluate)\.py[^`]*)`", cell):
                    machine = row_machine or _machine(column)
                    assert machine, f"no machine for {code!r} in README table {heading}"
                    found.append(Command(code, machine))
    return found


COMMANDS = readme_commands()
ABLATIONS = sorted(p.stem for p in (ROOT / "conf" / "ablation").glob("*.yaml"))


def test_the_readme_tables_list_both_machines_and_every_ablation():
    machines = {c.machine for c in COMMANDS}
    assert machines == {"cpu", "gpu"}
    experiments = {o.split("=")[1] for c in COMMANDS for o in c.overrides if "experiment=" in o}
    # Every ablation of conf/ablation/ is shown at both scales.
    pairs = {
        (e.split("=")[1], a.split("=")[1])
        for c in COMMANDS
        for e in c.overrides
        for a in c.overrides
        if e.startswith("experiment=") and a.startswith("ablation=")
    }
    for name in ABLATIONS:
        assert {("demo", name), ("paragrpo", name)} <= pairs, name
    assert "qwen2_5_vl" in experiments


def test_the_quick_start_is_two_real_commands():
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:.*\n\t\$\(PY\) train.py\s*$", makefile, re.M)
    assert re.search(r"^test:", makefile, re.M)


def _compose(command: Command, tmp_path: Path):
    name = ENTRY_CONFIG[command.script]
    run_dir = [f"run_dir={tmp_path}"] if name == "train" else []  # hydra:runtime is unset here
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose(name, overrides=[*command.overrides, *run_dir])


def _missing_experiment(command: Command) -> str | None:
    for override in command.overrides:
        group, _, name = override.partition("=")
        exists = (ROOT / "conf" / group / f"{name}.yaml").exists()
        if group in ("experiment", "ablation") and not exists:
            return f"{group}={name}"
    return None


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.machine}:{c.text[:70]}")
def test_each_command_composes_and_instantiates(command, tmp_path):
    missing = _missing_experiment(command)
    assert missing is None, f"the README names {missing}, which has no conf file"
    cfg = _compose(command, tmp_path)
    assert_built_as_configured(instantiate(cfg.model), cfg.model, "model")
    if command.script == "evaluate.py":
        return
    for group in ("rollout", "algorithm", "reward"):
        assert_built_as_configured(instantiate(cfg[group]), cfg[group], group)
    assert callable(instantiate(cfg.optimizer))
    accelerator = cfg.trainer.accelerator
    assert accelerator == ("gpu" if command.machine == "gpu" else "cpu"), command.text
    if command.machine == "gpu":
        assert type(instantiate(cfg.trainer.strategy)).__name__ == "ModelParallelStrategy"


CPU_TRAIN = [c for c in COMMANDS if c.machine == "cpu" and c.script == "train.py"]


@pytest.mark.parametrize("command", CPU_TRAIN, ids=lambda c: c.text[:70])
def test_each_cpu_training_command_runs_one_step(
    command, tmp_path, tiny_qwen3_dir, tiny_qwen25_dir, needle_dir
):
    from paravt.run.build import build_run, maybe_cold_start
    from train import check_inputs

    missing = _missing_experiment(command)
    assert missing is None, f"the README names {missing}, which has no conf file"
    cfg = _compose(command, tmp_path)
    check_inputs(cfg)  # as written: the default artifact paths may be generated/built
    tiny = tiny_qwen25_dir if cfg.model.build_tiny == "qwen2_5_vl" else tiny_qwen3_dir
    local = {
        **ONE_STEP,
        "model.path": str(tiny),
        "model.tiny_dir": str(tiny),
        "data.train_path": str(needle_dir / "train.jsonl"),
        "data.eval_path": str(needle_dir / "eval.jsonl"),
        "data.generate": None,
        "callbacks.benchmark_validation.samples_path": str(needle_dir / "eval.jsonl"),
    }
    with open_dict(cfg):
        for key, value in local.items():
            if OmegaConf.select(cfg, key, default="<absent>") != "<absent>":
                OmegaConf.update(cfg, key, value, merge=False)
    run = build_run(cfg)
    run = maybe_cold_start(cfg, run)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    assert run.trainer.global_step == 1
    assert "reward" in run.trainer.callback_metrics
