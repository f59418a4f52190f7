"""How a multi-GPU / multi-node run is launched: the data-parallel strategy and who is a child.

- `data_parallel_strategy`: Lightning's `ModelParallelStrategy` with pure data parallelism over
  EVERY process of the run, devices x num_nodes (Lightning's own "auto" would make it
  `num_nodes`, and `${trainer.devices}` alone is wrong on more than one node).
- `launched_child`: whether this process is a rank Lightning's subprocess launcher (or torchrun,
  SLURM) started, i.e. not the process the user typed. Such a process must not start a Hydra
  sweep of its own: `paravt.sweep.single_job_overrides` turns its command line into the one job
  its parent runs (docs/multi_gpu.md).
"""

from __future__ import annotations


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
