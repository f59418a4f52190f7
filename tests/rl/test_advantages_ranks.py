"""Batch-normalised advantages over data-parallel ranks: the whole batch's statistics.

Each rank holds whole groups, so the group advantages are local, but the batch normalisation
after them must use every rank's share (`global_float_sums`), or a rank's advantages depend on
which groups it drew and on the world size. Three real gloo ranks on loopback, one empty.
"""

from __future__ import annotations

import json
import math
import socket

import pytest
import torch

from paravt.rl.objective import AdvantageConfig, compute_advantages

CFG = AdvantageConfig(shaping=False, batch_norm=True)
# group 0 and group 2 score alike (zero variance), group 1 has a spread
WHOLE = [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]]
SHARES = [WHOLE[:2], WHOLE[2:], []]  # rank 0: groups 0-1, rank 1: group 2, rank 2: none


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from paravt.parallel.collectives import leave_group
    from paravt.parallel.distributed import global_float_sums

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    rewards = torch.tensor(SHARES[rank], dtype=torch.float64).view(-1, 4)
    adv = compute_advantages(rewards, CFG, global_float_sums)
    with open(f"{out}/{rank}.json", "w") as handle:
        json.dump(adv.values.tolist(), handle)
    leave_group()


def test_each_rank_normalises_with_the_whole_batch_statistics(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(3, port, str(tmp_path)), nprocs=3, join=True)
    got = [v for r in range(3) for v in json.loads((tmp_path / f"{r}.json").read_text())]
    one_process = compute_advantages(torch.tensor(WHOLE), CFG).values
    torch.testing.assert_close(torch.tensor(got), one_process, rtol=0, atol=1e-7)
    # group 1: (r - 0.5) / unbiased std sqrt(1/3) = -+sqrt(3)/2; over all 12 rollouts mean 0 and
    # biased std sqrt(4 x 3/4 / 12) = 1/2, so -+sqrt(3) (rank 0's share alone: std sqrt(3/8),
    # -+sqrt(2)); the equal groups 0 and 2 stay 0
    s3 = math.sqrt(3)
    assert got == pytest.approx([0.0] * 4 + [-s3, -s3, s3, s3] + [0.0] * 4, abs=1e-5)
