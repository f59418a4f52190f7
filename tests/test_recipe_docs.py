"""The paper recipe's settings table in docs/method.md against `experiment=paragrpo` composed,
and docs/engines.md's table of the reference's 1 + 7 topology against `experiment=paragrpo_1p7`.

Each table is the one statement of its recipe's settings in the docs; these tests compose the
recipe through Hydra and compare every row, so the docs and the config cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| ([^|]+) \| `([\w./]+)` \| ([^|]+) \|$")
# The settings the recipe's docs must state (a row missing from the table fails the test).
REQUIRED = {
    "rollout.mode",
    "rollout.max_staleness",
    "algorithm.loss",
    "rollout.engine.name",
    "rollout.group_size",
    "rollout.temperature",
    "optimizer.lr",
    "algorithm.kl_coef",
    "algorithm.anchor_coef",
}


# | reference setting | paravt | `config key` | value | (docs/engines.md's topology table)
TOPOLOGY_ROW = re.compile(r"^\| ([^|]+) \| ([^|]+) \| `([\w./]+)` \| ([^|]+) \|$")
TOPOLOGY_REQUIRED = {
    "trainer.devices",
    "rollout.engine.devices",
    "rollout.mode",
    "rollout.max_staleness",
    "algorithm.loss",
}


def documented_settings() -> dict[str, str]:
    """{config key: value} from the rows of method.md's recipe table."""
    text = (ROOT / "docs" / "method.md").read_text()
    rows = (ROW.match(line.strip()) for line in text.splitlines())
    return {m.group(2): m.group(3).strip() for m in rows if m}


def same(cell: str, value: object) -> bool:
    """Numbers compare as numbers (2.0e-6 == 2e-06), everything else as text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return cell == str(value)
    return float(cell) == float(value)


def test_method_md_states_the_recipe_settings_the_config_composes():
    documented = documented_settings()
    assert documented.keys() >= REQUIRED, sorted(REQUIRED - documented.keys())
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=paragrpo"])
    wrong = {
        key: (cell, OmegaConf.select(cfg, key, default="<absent>"))
        for key, cell in documented.items()
        if not same(cell, OmegaConf.select(cfg, key, default="<absent>"))
    }
    assert not wrong, f"docs/method.md (documented, composed): {wrong}"


def test_a_row_that_disagrees_is_caught():
    # The comparison itself: a staleness of 2 in the docs is not the config's 0, 1e-6 not 2e-6.
    assert not same("2", 0) and not same("1.0e-6", 2.0e-6) and not same("ppo", "ppo_engine_is")
    assert same("2.0e-6", 2.0e-6) and same("0", 0) and same("sync", "sync")


def _composed(experiment: str):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[f"experiment={experiment}"])


def test_engines_md_states_the_1p7_topology_the_config_composes():
    text = (ROOT / "docs" / "engines.md").read_text()
    rows = (TOPOLOGY_ROW.match(line.strip()) for line in text.splitlines())
    documented = {m.group(3): m.group(4).strip() for m in rows if m}
    assert documented.keys() >= TOPOLOGY_REQUIRED, sorted(TOPOLOGY_REQUIRED - documented.keys())
    cfg = _composed("paragrpo_1p7")
    wrong = {
        key: (cell, OmegaConf.select(cfg, key, default="<absent>"))
        for key, cell in documented.items()
        if not same(cell, OmegaConf.select(cfg, key, default="<absent>"))
    }
    assert not wrong, f"docs/engines.md (documented, composed): {wrong}"
    # the two roles fill one 8-GPU node, as the reference's d1 + d7
    assert cfg.trainer.devices + len(cfg.rollout.engine.devices) == 8
