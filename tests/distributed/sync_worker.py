"""One rank of the weight-sync gather check (issue 50, finding 8): an FSDP2-sharded model's
weights gathered at bf16 by `iter_weights` (a rank with an engine) and by `gather_only` (a rank
that discards them), recording the dtype of every all-gather the gathers issue, and the bytes
each rank moves to the host in the async publish and in a rollout server's checkpoint."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


def _is_host(device) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu"


class HostCopies(TorchFunctionMode):
    """Bytes the code under it moves to the host: results of `Tensor.cpu()` and of `Tensor.to`
    with a host device. On a GPU each is a device-to-host copy; on a CPU the same calls are
    no-ops, but they are made, and counted, all the same."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        to_host = func is torch.Tensor.to and (
            any(_is_host(a) for a in args[1:]) or _is_host(kwargs.get("device"))
        )
        if func is torch.Tensor.cpu or to_host:
            self.bytes += out.numel() * out.element_size()
        return out


class GatherDtypes(TorchDispatchMode):
    """The dtypes of the all-gathers run under it (DTensor's `full_tensor` issues functional
    collectives, which pass through the dispatcher where this mode sees them)."""

    def __init__(self):
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "all_gather" in str(func):
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


def run(_unused: str) -> dict:
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from paravt.rollout.sync.weight_sync import gather_only, iter_weights

    torch.manual_seed(0)  # the same fp32 weights on both ranks
    model = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 4))
    expected = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with GatherDtypes() as synced:
        got = {n: t for b in iter_weights(model, 64, None, torch.bfloat16) for n, t in b}
    with GatherDtypes() as discarded:
        gather_only(model, 64, torch.bfloat16)
    return (
        {
            "got": got,
            "expected": expected,
            "synced": synced.dtypes,
            "discarded": discarded.dtypes,
        }
        | _server_checkpoint(model)
        | _host_bytes(model)
    )


def _host_bytes(model) -> dict:
    """Bytes moved to the host by each rank: in an async publish (rank 0 holds the shared
    copy, rank 1 joins the gather) and in a rollout server's checkpoint (rank 0 writes it)."""
    import tempfile
    from pathlib import Path

    import torch.distributed as dist
    import torch.multiprocessing as mp

    from paravt.rollout.serving.checkpoint import write_checkpoint
    from paravt.rollout.sync.shared_weights import SharedWeights
    from paravt.rollout.sync.weight_sync import WeightSync, gather_only

    lead = dist.get_rank() == 0
    if lead:
        shared = SharedWeights.create(model, 0, mp.get_context("spawn"), torch.bfloat16, 64)
    else:
        shared = gather_only(model, 64, torch.bfloat16)  # rank 0's create
    with HostCopies() as published:
        WeightSync.publish(shared, model, 1, 64, torch.bfloat16)
    folder = Path(tempfile.mkdtemp()) / "v2" if lead else None
    with HostCopies() as written:
        write_checkpoint(model, folder, torch.bfloat16, bucket_bytes=64)
    return {"published_host_bytes": published.bytes, "written_host_bytes": written.bytes}


def _server_checkpoint(model) -> dict:
    """A rollout server's sync checkpoint (`write_checkpoint`): rank 0 writes it at bf16, rank
    1 only joins the gather; the dtypes of the gathers and what rank 0 wrote."""
    import tempfile
    from pathlib import Path

    import torch.distributed as dist
    from safetensors.torch import load_file

    from paravt.rollout.serving.checkpoint import write_checkpoint

    folder = Path(tempfile.mkdtemp()) / "v1" if dist.get_rank() == 0 else None
    with GatherDtypes() as written:
        write_checkpoint(model, folder, torch.bfloat16, bucket_bytes=64)
    files = sorted(folder.glob("*.safetensors")) if folder else []
    return {
        "written": {k: v for f in files for k, v in load_file(f).items()},
        "checkpoint": written.dtypes,
    }
