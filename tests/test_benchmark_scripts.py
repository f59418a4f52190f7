"""Every script in benchmarks/ still starts: `--help` imports all of it (a module moved by a
refactor broke `benchmarks/packed_update.py` once, unnoticed until someone ran it).

One subprocess imports the heavy libraries the scripts share (torch, transformers, Lightning,
Hydra: seconds each) once, then forks a child per script that runs it as `python SCRIPT --help`
would (`__main__`, its folder first on the path, its own stdout and stderr): each script still
starts from a clean copy of that interpreter, with none of paravt or of the other scripts
imported, and the 20 launches pay those imports once instead of 20 times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))

# Runs in the subprocess: argv = [results.json, script, ...].
HELP_EACH = r"""
import json, os, runpy, sys, tempfile, traceback

import hydra, lightning.pytorch, torch  # noqa: F401  the shared heavy imports, paid once
from transformers import AutoModelForImageTextToText, AutoProcessor  # noqa: F401

def help_of(script, out, err):
    # In the child: fd 1 and 2 to files, then what `python script --help` does.
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.argv = [script, "--help"]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

results = {}
for script in sys.argv[2:]:
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            help_of(script, out, err)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        results[script] = {"returncode": code, "stdout": out.read(), "stderr": err.read()}
with open(sys.argv[1], "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict[str, dict]:
    """script path -> its `--help` run: returncode, stdout, stderr."""
    out = tmp_path_factory.mktemp("benchmark_helps") / "results.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", HELP_EACH, str(out), *map(str, SCRIPTS)]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_benchmark_folder_is_found():
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_benchmark_script_imports_and_shows_its_options(script, helps):
    done = helps[str(script)]
    assert done["returncode"] == 0, done["stderr"][-2000:]
    assert "usage:" in done["stdout"]
