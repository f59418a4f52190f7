"""One agent protocol: the dataclass defaults are conf/rollout/default.yaml's, and `paravt rollout`
starts from them too, so a setting left out anywhere means the same thing everywhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from paravt.agent.loop import AgentConfig
from paravt.agent.tools import CropConfig
from paravt.modules.rollout_datamodule import RolloutConfig
from paravt.rollout.engine import EngineConfig
from paravt.run import inspect

ROOT = Path(__file__).resolve().parents[1]
YAML = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "rollout" / "default.yaml"))


def _differences(cls, values: dict) -> list[str]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = []
    for key, value in values.items():
        if key.startswith("_") or key in ("defaults", "toolbox") or isinstance(value, dict):
            continue
        assert key in fields, f"{cls.__name__} has no field {key!r} (YAML key)"
        f = fields[key]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if default != value:
            out.append(f"{cls.__name__}.{key}: dataclass {default!r}, YAML {value!r}")
    return out


@pytest.mark.parametrize(
    ("cls", "section"),
    [(RolloutConfig, None), (AgentConfig, "agent"), (CropConfig, "crop")],
)
def test_dataclass_defaults_are_the_yaml_defaults(cls, section):
    values = YAML if section is None else YAML[section]
    assert _differences(cls, values) == []


def test_the_engine_defaults_are_the_yaml_defaults():
    hf = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "rollout" / "engine" / "hf.yaml"))
    assert _differences(EngineConfig, hf) == []


def test_the_check_sees_a_difference():
    assert _differences(AgentConfig, {"max_new_tokens": 7}) == [
        "AgentConfig.max_new_tokens: dataclass 2048, YAML 7"
    ]


def test_the_call_cap_has_one_knob_and_no_crop_factor_in_yaml():
    assert "sequential" not in {f.name for f in dataclasses.fields(AgentConfig)}
    assert "factor" not in YAML["crop"]  # read from the model's processor by AgentLoop


def test_paravt_rollout_starts_from_the_same_defaults():
    args = inspect.build_parser().parse_args(["--model", "m", "--data", "d"])
    agent, crop = AgentConfig(), CropConfig()
    assert (args.rounds, args.mode, args.max_new_tokens) == (
        agent.max_rounds,
        agent.mode,
        agent.max_new_tokens,
    )
    assert args.max_calls_per_turn == crop.max_calls_per_turn
    assert (args.frame_budget, args.temperature) == (YAML["frame_budget"], YAML["temperature"])
