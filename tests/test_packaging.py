"""paravt installs one top-level package: the callbacks/ folder is `paravt.callbacks`.

A global `callbacks` package would be shadowed by any user project's own callbacks.py; these tests
run a user module beside such a file, check that pyproject.toml ships every package under the
paravt name, and that a config naming the old `callbacks.X` targets gets the fix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from paravt.errors import UserError
from paravt.run.build import build_callbacks

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # the standard library from Python 3.11

USER_CALLBACKS = """
class MyCallback:
    pass
"""

USER_MODULE = """
from callbacks import MyCallback
from paravt.callbacks import FrameBudgetGating, RolloutLogger
import paravt.callbacks.frame_budget as frame_budget

assert FrameBudgetGating is frame_budget.FrameBudgetGating
print(MyCallback.__module__, FrameBudgetGating.__module__, RolloutLogger.__name__)
"""


def test_a_user_module_beside_its_own_callbacks_py_imports_paravts_callbacks(tmp_path):
    (tmp_path / "callbacks.py").write_text(USER_CALLBACKS)
    (tmp_path / "my_module.py").write_text(USER_MODULE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "my_module.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["callbacks", "paravt.callbacks.frame_budget", "RolloutLogger"]


def test_pyproject_ships_every_package_under_paravt_and_no_global_callbacks():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"] == {"paravt.callbacks": "callbacks"}
    # every folder that ships a file: a Python package, or a data folder (the chat templates)
    shipped = [p for p in (ROOT / "paravt").rglob("*") if p.suffix in (".py", ".jinja")]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in shipped}
    assert set(setup["packages"]) == on_disk | {"paravt.callbacks"}
    assert all(p == "paravt" or p.startswith("paravt.") for p in setup["packages"])


def test_the_wheel_builds_without_warnings_and_ships_the_chat_templates(tmp_path):
    # A copy of what the wheel is built from: setuptools writes build/ and *.egg-info beside it.
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    for folder in ("paravt", "callbacks"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = "import setuptools.build_meta as b, sys; print(b.build_wheel(sys.argv[1]))"
    out = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path / "dist")],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    # setuptools warned "Package 'paravt.models.templates' is absent from the `packages`
    # configuration" while the templates were package data of paravt.models
    assert "absent from the `packages`" not in out.stderr, out.stderr
    wheel = tmp_path / "dist" / out.stdout.split()[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    templates = {p.relative_to(ROOT).as_posix() for p in (ROOT / "paravt").rglob("*.jinja")}
    assert len(templates) == 2 and templates <= names
    assert "paravt/callbacks/frame_budget.py" in names


@pytest.mark.parametrize("name", ["FrameBudgetGating", "progress.StepProgress"])
def test_an_old_global_callbacks_target_is_refused_naming_the_new_one(name):
    cfg = OmegaConf.create({"callbacks": {"cb": {"_target_": f"callbacks.{name}"}}})
    with pytest.raises(UserError, match=rf"fix: callbacks\.cb\._target_=paravt\.callbacks\.{name}"):
        build_callbacks(cfg)


def test_the_default_config_names_every_callback_under_paravt():
    conf = OmegaConf.load(ROOT / "conf" / "callbacks" / "default.yaml")
    targets = [c["_target_"] for c in conf.values()]
    assert all(t.startswith("paravt.") for t in targets), targets
    assert [
        type(c).__name__
        for c in build_callbacks(
            OmegaConf.create({"callbacks": {k: v for k, v in conf.items() if k == "progress"}})
        )
    ] == ["StepProgress"]
