"""docs/reuse.md's standalone example runs as written, outside the repository, and every piece of
paravt it lifts does something observable (each assertion names the piece)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- reuse-example -->\n```python\n"


def example_code() -> str:
    text = (ROOT / "docs" / "reuse.md").read_text()
    start = text.index(MARKER) + len(MARKER)
    return text[start : text.index("```", start)]


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
