"""Finding 7: multi-node ranks and Hydra sweeps under Lightning's launcher (2 CPU ranks, gloo).

- Two nodes of one rank each (two `train.py` processes with NODE_RANK 0 / 1 over loopback, as
  torchrun or SLURM start them) train the same weights as one node with two ranks (the sweep's
  job 0: the same settings and seed).
- `train.py -m ... trainer=fsdp_cpu` (2 jobs x 2 ranks): Lightning's launcher re-runs the user's
  command line in its child; each job must still run exactly once, in its own folder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = [
    "trainer=fsdp_cpu",
    "cold_start=null",
    "data.batch_size=3",
    "rollout.group_size=2",
    "rollout.agent.max_new_tokens=8",
    "rollout.agent.max_rounds=1",
    "algorithm.kl_coef=0.1",
    "callbacks.benchmark_validation=null",
    "callbacks.rollout_logger=null",
    "trainer.max_steps=1",
]


def _env(**extra: str) -> dict:
    return os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)} | extra


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _cmd(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *args]


@pytest.fixture(scope="module")
def sweep(tiny_run_overrides, tmp_path_factory) -> tuple[Path, str]:
    """`train.py -m ... seed=0,1` on one node of two ranks: (the sweep folder, its output).
    Job 0 is also the one-node reference of the two-node run (the same settings and seed)."""
    folder = tmp_path_factory.mktemp("sweep")
    args = [*tiny_run_overrides, *SETTINGS, "seed=0,1", f"hydra.sweep.dir={folder}"]
    proc = subprocess.run(
        _cmd("-m", *args), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1400
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return folder, out


def test_two_nodes_of_one_rank_train_like_one_node_of_two(
    sweep, tiny_run_overrides, tiny_qwen3_dir, tmp_path
):
    port = _port()
    args = [*tiny_run_overrides, *SETTINGS, "seed=0", "trainer.devices=1", "trainer.num_nodes=2"]
    procs = []
    for node in (0, 1):  # shared file system: one run folder, as under SLURM
        env = _env(NODE_RANK=str(node), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = _cmd(*args, f"hydra.run.dir={tmp_path}")
        log = open(tmp_path.parent / f"node{node}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log), log))
    for proc, log in procs:
        proc.wait(timeout=1400)
        log.close()
    logs = [(tmp_path.parent / f"node{n}.log").read_text() for n in (0, 1)]
    assert [p.returncode for p, _ in procs] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "MEMBER: 2/2" in logs[1]  # node 1's rank is global rank 1 of 2
    two, one = _weights(tmp_path / "hf"), _weights(sweep[0] / "0" / "hf")
    assert max(float((two[k] - one[k]).abs().max()) for k in one) < 1e-5
    initial = _weights(Path(tiny_qwen3_dir))  # the step moved the weights: not the trivial equality
    assert max(float((one[k] - initial[k]).abs().max()) for k in one) > 1e-5


def test_a_sweep_on_two_ranks_runs_each_job_once(sweep):
    folder, out = sweep
    assert out.count("== paravt run") == 2  # one summary per job, from its rank 0
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["0", "1"]
    for job in ("0", "1"):
        run = folder / job
        assert (run / ".hydra" / "overrides.yaml").exists()  # rank 0's only
        assert (run / "hf" / "model.safetensors").exists()
        assert (run / "train_ddp_process_1.log").exists()  # the child ran in this folder
        assert f"seed={job}" in (run / ".hydra" / "overrides.yaml").read_text()
