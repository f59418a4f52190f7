"""Every script in benchmarks/ still starts: `--help` imports all of it (a module moved by a
refactor broke `benchmarks/packed_update.py` once, unnoticed until someone ran it).

Each script runs as `python SCRIPT --help` would (`__main__`, its folder first on the path, its
own stdout, stderr and exit code) in a process forked from one interpreter that imported the
heavy libraries the scripts share (torch, transformers, Lightning, Hydra: seconds each) once
(tests/forkserver.py): each script still starts from a clean copy of that interpreter, with none
of paravt or of the other scripts imported, and the launches pay those imports once.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _help(script: Path, logs: Path) -> subprocess.CompletedProcess:
    return forkserver.run([str(script), "--help"], logs, ROOT)  # its folder first, as `python`


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """script path -> its `--help` run."""
    logs = tmp_path_factory.mktemp("benchmark_helps")
    return {str(script): _help(script, logs) for script in SCRIPTS}


def test_the_benchmark_folder_is_found():
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_benchmark_script_imports_and_shows_its_options(script, helps):
    done = helps[str(script)]
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
