"""Full checkpoints for rollout servers: written by the trainer, checked before a server loads one.

A rollout server reloads its weights from a folder of safetensors files on disk (or tmpfs) that
the trainer and the server both see. vLLM accepts a partial folder with only a warning and then
samples from a corrupted model, so paravt checks the folder itself before any server is told of
it: every tensor of the model present, nothing else, each with the model's shape, and every
file whole (its size covers the data its header promises). The check reads only the files'
headers (`read_headers`, stdlib only); `write_checkpoint` writes one file per bucket of the
policy's full weights (gathered from FSDP2 shards, merged for LoRA), so at most one bucket of
full weights exists in memory at a time.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

Manifest = Mapping[str, tuple[int, ...]]  # tensor name -> shape


class CheckpointError(ValueError):
    """A checkpoint folder a rollout server must not load (partial, mismatched, truncated)."""


def read_headers(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor in the folder's *.safetensors files; raises on a file that
    is shorter than its header says (a write cut off) or a name found in two files."""
    out: dict[str, tuple[int, ...]] = {}
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files (an empty or unfinished write)")
    for path in files:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated (no safetensors header)")
            (n,) = struct.unpack("<Q", head)
            header = json.loads(f.read(n) or b"{}")
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in out:
                raise CheckpointError(f"{path}: tensor {name!r} is also in another file")
            out[name] = tuple(info["shape"])
            end = max(end, info["data_offsets"][1])
        if size < 8 + n + end:
            raise CheckpointError(
                f"{path}: truncated ({size} bytes, its header needs {8 + n + end}); the write "
                "was cut off"
            )
    return out


def check_checkpoint(folder: str | Path, expected: Manifest) -> None:
    """Refuse a folder whose tensors are not exactly the model's (`expected`), naming the
    difference: missing tensors (partial), unknown tensors or other shapes (mismatched)."""
    got = read_headers(folder)
    missing = sorted(set(expected) - set(got))
    if missing:
        raise CheckpointError(
            f"{folder}: partial checkpoint, {len(missing)} of the model's {len(expected)} "
            f"tensors missing (e.g. {missing[:3]}); a rollout server would load it with only a "
            "warning and sample from a corrupted model"
        )
    extra = sorted(set(got) - set(expected))
    if extra:
        raise CheckpointError(
            f"{folder}: {len(extra)} tensor(s) the model does not have (e.g. {extra[:3]}): a "
            "checkpoint of another model"
        )
    shapes = [(k, got[k], tuple(expected[k])) for k in sorted(got) if got[k] != tuple(expected[k])]
    if shapes:
        name, have, want = shapes[0]
        raise CheckpointError(
            f"{folder}: mismatched checkpoint, {len(shapes)} tensor(s) of another shape (e.g. "
            f"{name}: {list(have)}, the model's is {list(want)})"
        )


def _policy_buckets(
    policy, bucket_bytes: int, dtype=None, device: str | None = "cpu"
) -> Iterator[list[tuple[str, object]]]:
    """Buckets of the policy's full weights under the names vLLM loads (LoRA: merged): the one
    gather helper's, at `dtype` (cast shard by shard before the gather), on the host or, with
    `device` None, left where they were gathered (a rank that writes nothing)."""
    from paravt.rollout.sync.weight_sync import iter_weights

    yield from iter_weights(policy, bucket_bytes, device, dtype)


def model_manifest(policy) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor a full checkpoint of `policy` holds (global shapes of a
    sharded policy; merged names of a LoRA one), read from the model, not from a checkpoint."""
    from paravt.models.lora import is_lora

    if is_lora(policy):  # the merged names are known only by merging (once, at the first sync)
        return {n: tuple(t.shape) for b in _policy_buckets(policy, 256 << 20) for n, t in b}
    return {n: tuple(t.shape) for n, t in policy.state_dict().items()}


def write_checkpoint(
    policy, folder: str | Path | None, dtype, bucket_bytes: int = 256 << 20
) -> Path | None:
    """`policy`'s full weights at `dtype` into a new `folder`, one safetensors file per bucket.

    An FSDP2 policy is gathered, a collective: every rank calls this and iterates to the end,
    the ranks that write nothing with `folder` None. A failed write (disk full, a folder that
    cannot be made) is raised only after the gather has run through, so no peer is left
    waiting in it."""
    from safetensors.torch import save_file

    error: Exception | None = None
    if folder is not None:
        folder = Path(folder)
        try:
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
        except OSError as err:
            error = err
    device = None if folder is None else "cpu"  # a rank that writes nothing copies nothing
    for i, bucket in enumerate(_policy_buckets(policy, bucket_bytes, dtype, device)):
        if folder is None or error is not None:
            continue
        try:  # clone: tied weights share storage, which safetensors refuses to write twice
            tensors = {n: t.detach().to(dtype).contiguous().clone() for n, t in bucket}
            save_file(tensors, str(folder / f"part-{i:05d}.safetensors"))
        except Exception as err:
            error = err
    if error is not None:
        raise error
    return folder
