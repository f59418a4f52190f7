"""docs/reuse.md's standalone example runs as written, outside the repository, and every piece of
paravt it lifts does something observable (each assertion names the piece)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- reuse-example -->\n```python\n"


def example_code(marker: str = MARKER) -> str:
    text = (ROOT / "docs" / "reuse.md").read_text()
    start = text.index(marker) + len(marker)
    return text[start : text.index("```", start)]


def test_the_curriculum_constructor_is_documented_with_an_example_that_builds():
    from paravt.callbacks import FormatAnchorCurriculum
    from paravt.callbacks.schedules import REQUIRED

    text = (ROOT / "docs" / "reuse.md").read_text()
    signature = "FormatAnchorCurriculum(format_schedule=None, anchor_schedule=None)"
    assert signature in text
    assert list(inspect.signature(FormatAnchorCurriculum).parameters) == [
        "format_schedule",
        "anchor_schedule",
    ]
    for kind, keys in REQUIRED.items():  # every schedule kind with the keys it needs
        assert f"`{kind}`" in text and all(f"`{key}`" in text for key in keys), kind
    scope: dict = {}
    exec(example_code("<!-- curriculum-example -->\n```python\n"), scope)
    curriculum = scope["curriculum"]
    # step 50: linear 1.0 + (0.2 - 1.0) * 50 / 100 = 0.6; the step schedule's milestone 50 -> 0.1
    assert curriculum.values_at(50) == pytest.approx(
        {"curriculum/format_weight": 0.6, "curriculum/anchor_coef": 0.1}
    )
    assert curriculum.values_at(0) == {
        "curriculum/format_weight": 1.0,
        "curriculum/anchor_coef": 0.0,
    }


def test_the_reuse_example_runs_from_a_folder_outside_the_repository(tmp_path):
    code = example_code()
    assert 60 <= len(code.splitlines()) <= 110  # about 100 lines, ruff-formatted
    (tmp_path / "reuse_example.py").write_text(code)
    (tmp_path / "callbacks.py").write_text("OWN = True\n")  # a project's own callbacks module
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # as installed: only the paravt package
    out = subprocess.run(
        [sys.executable, "reuse_example.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["updated"]  # PARAGRPOLoss + the advantages moved the toy policy
    assert result["tool_responses"] > 0  # the parser's calls ran on the executor, on the mp4
    assert 0.0 < result["accuracy"] <= 1.0  # CategoryMean through self.log (a tensor)
    per = result["per_budget"]  # per_category(), budgets from FrameBudgetGating's list
    assert set(per) == {"overall", "budget=small", "budget=large"}
    assert per["overall"] == result["accuracy"]
    assert result["gate_logged"]  # the callback's gate metrics reached the CSV logger
    assert not (ROOT / "logs").exists() and (tmp_path / "square.mp4").is_file()
