"""How a multi-GPU / multi-node run is launched: the data-parallel strategy and who is a child.

- `data_parallel_strategy`: Lightning's `ModelParallelStrategy` with pure data parallelism over
  EVERY process of the run, devices x num_nodes (Lightning's own "auto" would make it
  `num_nodes`, and `${trainer.devices}` alone is wrong on more than one node).
- `export_job` / `child_argv` / `end_job`: a Hydra `-m` sweep on N devices runs each job once.
  Lightning's subprocess launcher re-runs the user's command line in every rank it starts;
  `child_argv` turns a child's command line into the one job its parent is running, and
  `end_job` frees the process group between jobs (docs/training.md).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence

JOB_ENV = "PARAVT_HYDRA_JOB"  # the parent's current Hydra job, for the ranks it starts
# What Lightning's launcher writes into the parent's environment when it starts ranks; left
# there, the next job of a sweep would believe its ranks are started externally (and hang).
LAUNCH_KEYS = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_before_job: dict[str, str | None] = {}


def data_parallel_strategy(devices: int, num_nodes: int = 1, **kwargs):
    """`ModelParallelStrategy(data_parallel_size=devices * num_nodes, tensor_parallel_size=1)`."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if int(devices) < 1 or int(num_nodes) < 1:
        raise ValueError(
            f"need trainer.devices >= 1 and num_nodes >= 1, got {devices}, {num_nodes}"
        )
    return ModelParallelStrategy(
        data_parallel_size=int(devices) * int(num_nodes), tensor_parallel_size=1, **kwargs
    )


def world_size(devices: int, num_nodes: int = 1) -> int:
    """The number of data-parallel ranks of a run (what shards the prompts and the model)."""
    return int(devices) * int(num_nodes)


def export_job(overrides: Sequence[str], output_dir: str) -> None:
    """Record this process's current Hydra job (its overrides and output folder) in the
    environment that Lightning's subprocess launcher copies into the ranks it starts."""
    _before_job.clear()
    _before_job.update({k: os.environ.get(k) for k in LAUNCH_KEYS})
    os.environ[JOB_ENV] = json.dumps({"overrides": list(overrides), "dir": str(output_dir)})


def child_argv(argv: Sequence[str], env: Mapping[str, str]) -> list[str] | None:
    """The command line a rank started by Lightning's launcher must run: its parent's job.

    Lightning re-runs the parent's whole command line in every child (`-m` and the sweep's
    comma lists included), so each child would run the sweep again, in a run folder of its own.
    A child (LOCAL_RANK > 0 with the parent's job in `env`) runs exactly that one job instead:
    the job's overrides, its output folder, no `.hydra/` of its own and a log named after the
    rank (`train_ddp_process_K.log`, Lightning's naming). None: not such a child.
    """
    job, local = env.get(JOB_ENV), env.get("LOCAL_RANK")
    if not job or local in (None, "", "0"):
        return None
    spec = json.loads(job)
    return [
        argv[0],
        *spec["overrides"],
        f'hydra.run.dir="{spec["dir"]}"',  # quoted, as Lightning does
        f"hydra.job.name=train_ddp_process_{local}",
        "hydra.output_subdir=null",
    ]


def end_job(ok: bool = True) -> None:
    """Tear the job's process group down, close its in-process vLLM engines and restore the
    launch variables Lightning set, so the next job of a sweep starts its own ranks, a fresh
    group and a fresh engine. `ok`: the job finished; the ranks then leave together
    (`leave_group`), a failed job's rank leaves at once."""
    from paravt.parallel.collectives import leave_group

    leave_group(wait_for_peers=ok)
    vllm_engines = sys.modules.get("paravt.rollout.engines.vllm")  # imported only by a vLLM run
    if vllm_engines is not None:
        vllm_engines.close_engines()  # the next job's engine starts on vLLM's clean state
    for key, value in _before_job.items():  # what the launcher set for this job only
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
