"""`train.py trainer=fsdp_cpu` (2 CPU ranks) with a video that fails to decode mid-step: the rank
whose only prompt it is trains on nothing that step (zero-weight dummy passes keep the FSDP
collectives in step), the run does not hang, and rank 0's summary counts the skips of all ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paravt.video.writer import write_video
from tests import forkserver

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _corrupt_mid_file(path: Path) -> Path:
    """A noise mp4 with 20 kB zeroed at 60%: frame 0 decodes (it passes the load check), the
    frames a rollout reads do not."""
    rng = np.random.default_rng(0)
    write_video(path, [rng.integers(0, 255, (64, 64, 3), dtype=np.uint8) for _ in range(40)], 4.0)
    data = bytearray(path.read_bytes())
    at = int(len(data) * 0.6)
    data[at : at + 20_000] = bytes(20_000)
    path.write_bytes(bytes(data))
    return path


def test_a_rank_left_with_no_prompt_does_not_hang_the_others(tiny_run_overrides, tmp_path):
    needle_train = Path(next(o for o in tiny_run_overrides if "train_path" in o).split("=", 1)[1])
    good = [json.loads(line) for line in needle_train.read_text().splitlines()[:3]]
    for row in good:
        row["videos"][0]["video"] = str(needle_train.parent / row["videos"][0]["video"])
    bad = json.loads(json.dumps(good[0])) | {"id": "bad_prompt"}
    bad["videos"] = [{"video": str(_corrupt_mid_file(tmp_path / "corrupt.mp4"))}]
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in [bad, *good]))
    base = [o for o in tiny_run_overrides if not o.startswith(("data.train_path", "data.batch"))]
    args = [
        *base,
        f"data.train_path={rows}",
        "data.batch_size=2",  # one prompt per rank
        "data.shuffle=false",
        "trainer=fsdp_cpu",
        "trainer.max_steps=2",  # step 0 draws [bad, good0], step 1 [good1, good2]
        "cold_start=null",
        "model.freeze_vision=true",
        "rollout.agent.max_new_tokens=8",
        "algorithm.kl_coef=0.1",  # the reference's sharded forward runs too
        "callbacks.benchmark_validation=null",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = forkserver.run([str(ROOT / "train.py"), *args], tmp_path / "logs", ROOT)  # rank 0 forked
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "(2 RL steps)" in out
    assert "skipped: 1 video(s) undecodable during training, 1 prompt draw(s) left out" in out
    assert out.count("its video failed to decode") == 1 and "corrupt.mp4" in out
