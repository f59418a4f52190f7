"""The agent protocol a paravt policy was trained with, written beside its HF export.

A policy trained with a compact prompt, 2/4 overview frames and 8-frame crops does not behave the
same under the paper's evaluation protocol (full prompt, 64 frames, 16-frame crops): evaluated
that way the demo's policy never calls a tool. So `train.py` writes `paravt_protocol.json` next to
`hf/` (`protocol_of_training`), and `evaluate.py` on such a folder uses those settings unless the
command line sets them or `trained_protocol=false` asks for the paper's (`apply_trained_protocol`).

The file holds dotted keys of conf/eval.yaml (`rollout.agent.*`, `rollout.crop.*`,
`protocol.frame_budget`), the frame budgets trained on, and the needle annotation file the run
validated on. The dispatch mode stays the evaluation's choice (`mode=`): the tool-round count
and the call cap are taken from training only in the modes that run tools the way training did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FILE_NAME = "paravt_protocol.json"
AGENT_KEYS = (
    "mode",
    "system",
    "force_think",
    "max_rounds",
    "max_new_tokens",
    "max_total_tokens",
    "subagent_max_tokens",
    "overview_max_pixels",
    "tool_dialect",  # a policy trained on <tool_call> only is evaluated reading <tool_call> only
)
# crop.factor is not among them: every AgentLoop takes it from the processor.
CROP_KEYS = ("sample_fps", "min_frames", "max_frames", "max_pixels", "min_pixels")
# Set by the mode presets (conf/mode): taken from training only in these modes.
MODE_KEYS = {
    "rollout.agent.max_rounds": ("parallel", "sequential"),
    "rollout.crop.max_calls_per_turn": ("parallel",),
}
# Keys a record written by an earlier paravt may hold, under their current names.
FORMER_KEYS = {"protocol.num_frames": "protocol.frame_budget"}


def protocol_of_training(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The protocol record of a composed training config (plain nested mappings)."""
    rollout = cfg["rollout"]
    settings = {f"rollout.agent.{k}": rollout["agent"][k] for k in AGENT_KEYS}
    settings |= {f"rollout.crop.{k}": rollout["crop"][k] for k in CROP_KEYS}
    settings["rollout.crop.max_calls_per_turn"] = rollout["crop"]["max_calls_per_turn"]
    toolbox = rollout.get("toolbox")
    if toolbox and toolbox != [{"_target_": "paravt.agent.tools.CropVideoTool"}]:
        settings["rollout.toolbox"] = toolbox  # the default's record stays as it was
    gating = (cfg.get("callbacks") or {}).get("frame_budget_gating") or {}
    budgets = [int(b) for b in gating.get("frame_budgets") or [rollout["frame_budget"]]]
    settings["protocol.frame_budget"] = max(budgets)  # the largest budget trained on
    return {
        "written_by": "paravt train.py",
        "run": cfg.get("name"),
        "frame_budgets": budgets,
        "settings": settings,
        "needle_annotations": _needle_split(cfg),
    }


def _needle_split(cfg: Mapping[str, Any]) -> str | None:
    """The needle file the run validated on (BenchmarkValidation 'needle'), else the generated
    needle data's eval split, else None."""
    validation = (cfg.get("callbacks") or {}).get("benchmark_validation") or {}
    if validation.get("name") == "needle" and validation.get("samples_path"):
        return str(validation["samples_path"])
    data = cfg.get("data") or {}
    return data.get("eval_path") if data.get("generate") else None


def write_protocol(export_dir: str | Path, record: Mapping[str, Any]) -> Path:
    path = Path(export_dir) / FILE_NAME
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def read_protocol(model_path: str) -> dict[str, Any] | None:
    path = Path(os.path.expanduser(model_path)) / FILE_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{path} is not a readable protocol record ({error}); delete it, or pass "
            "trained_protocol=false to evaluate with conf/eval.yaml's protocol"
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ValueError(f"{path}: expected an object with a 'settings' object; delete it")
    record["settings"] = {FORMER_KEYS.get(k, k): v for k, v in record["settings"].items()}
    return record


def override_keys(overrides: Sequence[str]) -> set[str]:
    """The dotted keys a Hydra command line sets (`+k=v`, `++k=v`, `~k` included)."""
    return {o.lstrip("+~").split("=", 1)[0] for o in overrides}


def trained_settings(
    record: Mapping[str, Any], mode: str, benchmark: str, given: set[str]
) -> tuple[dict[str, Any], list[str]]:
    """(key -> value to apply, keys kept from the command line) for one evaluation."""
    chosen = {}
    for key, value in record["settings"].items():
        if key in MODE_KEYS and mode not in MODE_KEYS[key]:
            continue
        chosen[key] = value
    if benchmark == "needle" and record.get("needle_annotations"):
        chosen["benchmark.annotations"] = record["needle_annotations"]
    kept = sorted(k for k in chosen if k in given)
    return {k: v for k, v in chosen.items() if k not in given}, kept


def describe(model_path: str, applied: Mapping[str, Any], kept: Sequence[str]) -> str:
    """One line saying which protocol an evaluation runs."""
    shown = " ".join(f"{k}={v}" for k, v in applied.items())
    tail = f"; from the command line: {', '.join(kept)}" if kept else ""
    return (
        f"protocol: the one {model_path} was trained with ({FILE_NAME}; differs from "
        f"conf/eval.yaml in: {shown or 'nothing'}){tail}; trained_protocol=false uses "
        "conf/eval.yaml's"
    )
