"""Start W worker processes over gloo on this machine and collect what each rank wrote.

A plain subprocess launcher (what torchrun does, minus elasticity): one free loopback port, the
RANK / WORLD_SIZE / MASTER_* environment, one thread per rank, a hard wall-clock limit so a hang
fails the test instead of the CI job. The ranks check their collectives under the NCCL rule
(`PARAVT_COLLECTIVE_RULE=nccl`, paravt.parallel.collectives) while the transport is gloo.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], env: dict, log_path: Path, forked: bool) -> tuple:
    """(the rank's process, its open log or None): a fresh interpreter, or a fork from the
    server (its environment: the given one's entries added to the server's)."""
    if forked:
        from tests import forkserver

        return forkserver.start_script(WORKER, args, log_path, env), None
    log = open(log_path, "w")  # noqa: SIM115 - closed after wait
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), *args], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    return proc, log


def launch(
    args: list[str], out: Path, world_size: int = 2, timeout: float = 420, forked: bool = False
) -> list[dict]:
    """Run `worker.py *args` on `world_size` ranks; returns each rank's saved results. With
    `forked`, each rank is forked from an interpreter that imported torch, Lightning and
    transformers once (tests/forkserver.py) instead of starting a fresh one."""
    out.mkdir(parents=True, exist_ok=True)
    port = str(_free_port())
    procs = []
    for rank in range(world_size):
        env = os.environ | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            # Simulated NCCL on gloo: every paravt collective must hand over tensors built on
            # the backend's device, int64 / float32 (paravt.parallel.collectives).
            "PARAVT_COLLECTIVE_RULE": "nccl",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        procs.append(_start(args, env, out / f"rank{rank}.log", forked))
    try:
        for proc, _ in procs:
            proc.wait(timeout=timeout)
    except (subprocess.TimeoutExpired, TimeoutError):
        for proc, _ in procs:
            proc.kill()
        raise AssertionError(f"distributed worker hung past {timeout}s; logs in {out}") from None
    finally:
        for _, log in procs:
            if log is not None:
                log.close()
    failed = [r for r, (proc, _) in enumerate(procs) if proc.returncode]
    if failed:
        tails = "\n".join(
            f"--- rank {r}:\n" + (out / f"rank{r}.log").read_text()[-2000:] for r in failed
        )
        raise AssertionError(f"ranks {failed} failed:\n{tails}")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def one_and_two_ranks(args: list[str], root: Path, *tail: str) -> tuple[dict, list[dict]]:
    """`worker.py *args OUT *tail` on 1 rank (OUT = root/one) and on 2 ranks (root/two), each
    rank forked: (the 1-rank result, the 2-rank results per rank)."""
    one, two = (
        launch([*args, str(root / name), *tail], root / name, world_size=size, forked=True)
        for name, size in (("one", 1), ("two", 2))
    )
    return one[0], two
