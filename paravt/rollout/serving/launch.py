"""Start and stop rollout servers (`paravt serve-rollout`) from the trainer's process.

Each server is a child process in its own session, run by the configured interpreter (one with
vLLM: on a CPU .venv-vllm's, while the trainer runs in .venv), importing this same paravt. It
binds any free port and writes it to a file, so nothing races for ports; `start` waits for its
/health. A server is no rank of the trainer's launch: its environment drops the launcher's
variables (Lightning's WORLD_SIZE / MASTER_PORT would make vLLM take the external launcher and
bind the trainer's port: EADDRINUSE) and maps its GPUs through the trainer's
CUDA_VISIBLE_DEVICES (`server_env`). Servers never outlive the trainer: each watches its parent
and exits when it is gone, and `stop` (also run at exit) ends the whole session with SIGTERM,
then SIGKILL.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import paravt
from paravt.errors import UserError
from paravt.parallel.placement import visible_gpus, without_launch_vars

# vLLM's CPU backend on a small shared machine (paravt.rollout.engines.vllm.CPU_ENV).
SERVER_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64",
}


def repo_python() -> str | None:
    """.venv-vllm's interpreter beside the paravt source tree, if there is one."""
    path = Path(paravt.__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"
    return str(path) if path.exists() else None


def has_vllm(python: str) -> bool:
    # not resolved: two venvs' interpreters are links to the same base python
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        from importlib.util import find_spec

        return find_spec("vllm") is not None
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def server_python(configured: str) -> str:
    """The interpreter that runs the servers: `configured`, or for "" / "auto" this process's
    own when it has vLLM, else .venv-vllm's beside the source tree; refused when it lacks vLLM."""
    if configured not in ("", "auto"):
        python = configured
    elif has_vllm(sys.executable):
        python = sys.executable
    else:
        python = repo_python() or sys.executable
    if not Path(python).exists():
        raise UserError(f"rollout.engine.server_python={python} does not exist")
    if not has_vllm(python):
        raise UserError(
            f"the rollout server's interpreter {python} has no vLLM: set "
            "rollout.engine.server_python to one that has (on a CPU: .venv-vllm/bin/python after "
            "`make venv-vllm`), or give running servers in rollout.engine.server_urls"
        )
    return python


@dataclass
class ServerProcess:
    """A server this process started: its URL, process and log file."""

    url: str
    process: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the server's whole session (its own children included)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def stop(self, timeout_s: float = 15.0) -> None:
        if not self.alive():
            return
        self.kill(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.process.wait()


def server_argv(python: str, model_dir: str, cfg, port_file: str) -> list[str]:
    """The command line of one server for engine config `cfg` (an EngineConfig)."""
    argv = [python, "-m", "paravt.rollout.serving.server", "--model", str(model_dir), "--port", "0"]
    argv += ["--port-file", port_file, "--parent-pid", str(os.getpid())]
    argv += ["--dtype", cfg.dtype, "--max-model-len", str(cfg.max_model_len)]
    argv += [
        "--max-num-seqs",
        str(cfg.max_num_seqs),
        "--max-videos",
        str(cfg.max_videos_per_prompt),
    ]
    argv += ["--kv-cache-gb", str(cfg.kv_cache_gb), "--mm-cache-gb", str(cfg.mm_processor_cache_gb)]
    argv += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    argv += ["--tensor-parallel-size", str(cfg.tensor_parallel_size), "--seed", str(cfg.seed)]
    argv += ["--weight-transfer", cfg.weight_transfer]  # nccl: paravt.rollout.serving.nccl
    if not cfg.enable_prefix_caching:
        argv.append("--no-prefix-caching")
    return argv


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


def _wait_port(server: subprocess.Popen, port_file: Path, log: Path, deadline: float) -> int:
    while not port_file.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the rollout server did not start; its log {log}")
        time.sleep(0.2)
    return int(port_file.read_text())


def server_env(
    environ: Mapping[str, str], cfg, devices: Sequence[int] | None = None
) -> dict[str, str]:
    """A server's environment: `environ` less the launcher's variables, the CPU backend's
    variables, and for `devices` (GPUs as this process numbers them) CUDA_VISIBLE_DEVICES mapped
    through this process's own. PARAVT_ASSUME_GPU passes on (`paravt.parallel.placement`)."""
    env = without_launch_vars(environ) | SERVER_ENV
    env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.kv_cache_gb)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_gpus(environ, devices)
    # The server imports this same paravt (a source checkout or an install).
    src = str(Path(paravt.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def start_server(
    model_dir: str,
    cfg,
    python: str,
    log_dir: str | None = None,
    timeout_s: float = 600,
    devices: Sequence[int] | None = None,
) -> ServerProcess:
    """Start one server on `model_dir` and wait until its /health answers 200; `devices`: its
    GPUs as this process numbers them (`server_env`), None to inherit this process's."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="paravt_servers_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="server_", dir=log_dir))
    log, port_file = work / "server.log", work / "port"
    env = server_env(os.environ, cfg, devices)
    with log.open("w") as out:
        process = subprocess.Popen(
            server_argv(python, model_dir, cfg, str(port_file)),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stopped as a whole
        )
    deadline = time.monotonic() + timeout_s
    server = ServerProcess("", process, log)
    atexit.register(server.stop)
    try:
        server.url = f"http://127.0.0.1:{_wait_port(process, port_file, log, deadline)}"
        while not healthy(server.url):
            if not server.alive() or time.monotonic() > deadline:
                state = "exited" if not server.alive() else f"not healthy after {timeout_s:g} s"
                raise RuntimeError(
                    f"rollout server {server.url or '(no port yet)'} {state}; the end of its log "
                    f"{log}:\n{server.log_tail()}"
                )
            time.sleep(0.5)
    except BaseException:
        server.stop()
        raise
    return server
