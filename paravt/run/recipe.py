"""`paravt check-recipe <train.py overrides>`: will this training config run on its GPUs?

Composes the config exactly as `train.py` does (same conf/ folder, same overrides), then checks
it against its world size W = trainer.devices x trainer.num_nodes without a GPU, a checkpoint
or a process group: the checks below (`problems`), the files the run and its callbacks will
open (`files_to_open`), and a per-GPU memory plan (`paravt.run.memory_plan`). With the rollouts
on generation servers (`rollout/engine=vllm_server`) the servers' GPUs are checked against the
trainer's (`placement`: none shared, each named once, all on a node of `--gpus-per-node`) and a
server GPU gets a memory plan of its own. Exit 0: runnable; exit 2: each problem printed with
its fix. `train.py` runs the same `problems` at start-up (all but the node's GPU count and the
memory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paravt.run.recipe_memory import memory_report, server_report
from paravt.run.recipe_problems import (
    CONF,
    Problem,
    compose,
    config_problems,
    device_count_problems,
    files_to_open,
    missing_installs,
    notes,
    placement,
    problems,
    world_size,
)


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """The jobs of a `-m` command line (comma lists and range() expanded, cartesian product)."""
    from itertools import product

    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for o in parsed:
        if o.is_sweep_override():
            values = list(o.sweep_string_iterator())
            choices.append([f"{o.get_key_element()}={v}" for v in values])
        else:
            choices.append([o.input_line])
    return [list(job) for job in product(*choices)]


def check(
    overrides: list[str], gpu_gb: float, require_files: bool, gpus_per_node: int = 8
) -> tuple[str, int]:
    """(report, exit code) for one job's overrides."""
    cfg = compose(overrides)
    bad = config_problems(cfg)  # values train.py refuses: no memory plan is made from them
    found = bad + problems(cfg) + device_count_problems(cfg, gpus_per_node)
    lines = [f"recipe: {' '.join(overrides) or '(defaults)'}", f"world size: {world_size(cfg)}"]
    lines.append(placement(cfg))
    lines += [f"note: {n}" for n in notes(cfg)]
    lines += [f"note: to run it here: {p}" for p in missing_installs(cfg)]
    for key, path in files_to_open(cfg):
        ok = Path(path).exists()
        lines.append(f"file {key}: {path} ({'found' if ok else 'missing'})")
        if require_files and not ok:
            found.append(Problem(f"{key} names {path}, which does not exist", f"{key}=<a path>"))
    if bad:
        lines.append("memory plan: none until the config errors below are fixed")
    elif cfg.get("stage", "rl") != "sft":
        text, over = memory_report(cfg, gpu_gb, overrides)
        server_text, server_over = server_report(cfg, gpu_gb)
        lines += [text, server_text] if server_text else [text]
        found += over + server_over
    lines += [f"ERROR: {p}" for p in found]
    lines.append("recipe OK" if not found else f"recipe cannot run: {len(found)} problem(s)")
    return "\n".join(lines), 2 if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="paravt check-recipe",
        description="Compose train.py's config from the same overrides and check it against "
        "devices x num_nodes ranks and the generation servers' GPUs: errors with fixes (exit "
        "2), a per-GPU memory plan of each role.",
    )
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="GPU memory in GB (80)")
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=8,
        help="GPUs of each node, for the trainer's and the generation servers' devices (8)",
    )
    parser.add_argument(
        "--require-files", action="store_true", help="missing model/data files are errors"
    )
    args, overrides = parser.parse_known_args(argv)
    overrides = [o for o in overrides if o not in ("-m", "--multirun")]
    from hydra.errors import HydraException

    code = 0
    try:
        for job in expand_sweep(overrides):
            report, job_code = check(job, args.gpu_gb, args.require_files, args.gpus_per_node)
            print(report)
            code = max(code, job_code)
    except HydraException as error:  # an override Hydra cannot parse or compose
        return refuse_overrides(error, overrides)
    return code


def refuse_overrides(error: Exception, overrides: list[str]) -> int:
    """Hydra's own message in one line and train.py's "did you mean" hints; exit code 2."""
    from paravt.config_hints import typo_hints

    lines = [line.strip() for line in str(error).splitlines() if line.strip()][:2]
    print(f"paravt check-recipe: error: {' '.join(lines) or repr(error)}", file=sys.stderr)
    for line in typo_hints(CONF, "train", overrides):
        print(line, file=sys.stderr)
    return 2
