"""Script runs forked from one interpreter that imported the heavy libraries once.

A test that starts the same kind of script many times (kill it, resume it) pays torch, Lightning
and Hydra's imports (seconds of CPU each time) once: `multiprocessing`'s fork server imports
`PRELOAD`, and each `start(code, argv)` forks a fresh copy of it that runs `code` as `__main__`
with that argv, its stdout and stderr in a file. The child is a real process of its own
(SIGKILL, SIGSTOP and its exit code as with a subprocess); only the imports are shared. One
difference: multiprocessing ends the child with `os._exit`, so its `atexit` handlers do not run;
a run whose outputs a library may finish at exit (W&B, tests/modules/test_trackers.py)
stays a subprocess.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = ["torch", "lightning.pytorch", "torchmetrics", "hydra.utils", "omegaconf", "transformers"]
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


def _run(code: str, argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """In the child: what `python -c code *argv[1:]` would do in `cwd` with `env`."""
    for path, target in ((out, 1), (err, 2)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    for key, value in env.items():
        if value is None:  # unset
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    tempfile.tempdir = None  # TMPDIR as given here, not as the server first saw it
    os.chdir(cwd)
    sys.argv = list(argv)
    scope = {"__name__": "__main__"}
    if os.path.isfile(argv[0]):  # as `python path/script.py` does: the script's folder first
        scope["__file__"] = os.path.abspath(argv[0])
        sys.path.insert(0, os.path.dirname(scope["__file__"]))
    if "OMP_NUM_THREADS" in env and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    exec(compile(code, argv[0], "exec"), scope)


class Child:
    """The part of `subprocess.Popen` the tests use: pid, poll, send_signal, wait,
    communicate (stdout and stderr together), returncode."""

    def __init__(self, code: str, argv: list[str], env: dict, cwd: Path, out: Path, err: Path):
        self.output, self.errors = out, err
        args = (code, argv, env, str(cwd), str(out), str(err))
        self.process = _CONTEXT.Process(target=_run, args=args)
        self.process.start()
        self.pid = self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        self.process.join(0)
        return self.process.exitcode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: no signal to a child already reaped
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise TimeoutError(f"child {self.pid} still running after {timeout} s")
        return self.process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """(stdout, stderr), or (both, None) when they went to one file."""
        self.wait(timeout)
        if self.errors == self.output:
            return self.output.read_text(), None
        return self.output.read_text(), self.errors.read_text()


def start(code: str, argv: list[str], out: Path, env: dict | None = None, cwd=None, err=None):
    """Fork `code` with `argv` (argv[0]: the script's name in tracebacks) from the server;
    stdout goes to `out`, stderr to `err` (default: `out` too). `env` is added to the server's
    environment (a None value unsets that variable)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved]))
    try:  # the server (started by the first child) imports this checkout's tests and paravt
        return Child(code, argv, env or {}, Path(cwd or os.getcwd()), out, Path(err or out))
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


RUN_ENV = {"OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": None}  # None: unset in the child
# `python -m paravt.cli ...` as code a child runs (the `paravt` console script's entry point).
PARAVT_CLI = "import runpy\nrunpy.run_module('paravt.cli', run_name='__main__', alter_sys=True)\n"


def script_code(path) -> str:
    """Code that runs the script at `path` as `python path` does: `__main__`, its `__file__`."""
    return f"import runpy\nrunpy.run_path({str(path)!r}, run_name='__main__')\n"


def _new_file(folder: Path, suffix: str) -> Path:
    fd, path = tempfile.mkstemp(suffix=suffix, dir=folder)
    os.close(fd)
    return Path(path)


def run(
    argv: list[str],
    out_dir: Path,
    cwd=None,
    env: dict | None = None,
    timeout: float = 600,
    code: str | None = None,
) -> subprocess.CompletedProcess:
    """`subprocess.run(["python", *argv], capture_output=True, text=True)` as a fork: argv[0] is
    the script, run as `__main__` with its `__file__` (`runpy.run_path`), or `code` runs instead
    when given; stdout and stderr are captured in files under `out_dir`. Hydra's short errors
    (HYDRA_FULL_ERROR unset) and one OMP thread, as `tests/conftest.run_script` gives a
    subprocess. A child still running after `timeout` seconds is killed and
    `subprocess.TimeoutExpired` raised."""
    script = str(argv[0])
    code = script_code(script) if code is None else code
    out_dir.mkdir(parents=True, exist_ok=True)
    out, err = (_new_file(out_dir, suffix) for suffix in (".out", ".err"))
    child = start(code, [script, *argv[1:]], out, {**RUN_ENV, **(env or {})}, cwd, err)
    try:
        child.wait(timeout)
    except TimeoutError:
        child.kill()
        child.wait()
        raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text()) from None
    stdout, stderr = child.communicate()
    return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)


def start_script(script: Path, args: list[str], out: Path, env: dict | None = None, cwd=None):
    """`python script *args` forked from the server, stdout and stderr in `out`. argv[0] is the
    script's absolute path, as for a subprocess: Hydra finds its config folder beside it, and
    Lightning starts the other ranks of a multi-process run with it (fresh interpreters: only
    rank 0 is forked)."""
    script = Path(script).resolve()
    return start(script_code(script), [str(script), *args], out, env, cwd)
