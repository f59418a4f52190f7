"""benchmarks/scale_model.py's simulator on hand-computed schedules: constant-time stand-ins,
where a sync step is exactly generation + update, async overlaps them at staleness 1, a
too-stale streaming group is dropped and counted, and the engine's prefill and KV terms add up.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import scale_model
from scalemodel.clock import Clock, Engine, Request, Trainer
from scalemodel.modes import Setup, run_async, run_sync
from scalemodel.params import Params
from scalemodel.stream import run_stream, run_stream_per_turn
from scalemodel.workload import Rollout, Turn

# One turn of 100 tokens a trajectory, nothing else costs: a turn decodes at 0.1 s a token
# (all 56 trajectories of a step run at once), so generation is 10 s; a trajectory trains 100
# tokens, a rank's group 800 at 160 tokens/s: the update is 5 s; the sync costs nothing.
CONSTANT = replace(
    Params(),
    overview_frames=0,
    prompt_text_tokens=0,
    round_probs="1,0,0,0",
    turn_tokens_median=100.0,
    turn_tokens_sigma=0.0,
    decode_base_s=0.1,
    kv_bytes_per_token=0,
    prefill_tokens_per_s=float("inf"),
    vision_s_per_frame=0.0,
    train_tokens_per_s=160.0,
    rl_pass_factor=1.0,
    update_fixed_s=0.0,
    weights_gb=0.0,
    steps=6,
    warmup=1,
)


def test_a_sync_step_is_generation_plus_update():
    st = run_sync(Setup(7, 1, CONSTANT))
    assert st.ends == pytest.approx([15.0 * (i + 1) for i in range(6)])  # 10 + 5 each
    f = scale_model.figures(st, CONSTANT.warmup)
    assert f["steps/h"] == pytest.approx(240.0)  # 3600 / 15
    assert f["trainer idle"] == pytest.approx(2 / 3)  # 5 of 15 s busy
    assert f["generator idle"] == pytest.approx(1 / 3)  # 10 of 15 s busy
    assert f["staleness max"] == 0


def test_colocated_sync_plays_each_ranks_share_on_its_own_engine():
    # 8 ranks, 7 prompts: ranks 0-6 generate one group each on their own engine (10 s), rank 7
    # none; the update waits for a 1-group rank (5 s): 15 s a step, as on one server.
    st = run_sync(Setup(8, 0, CONSTANT))
    assert st.ends[:2] == pytest.approx([15.0, 30.0])
    assert st.engines == 8


def test_async_at_staleness_1_overlaps_to_the_slower_side():
    # generation of step t+1 (10 s) runs during update t (5 s): after the first step a step
    # costs max(10, 5) = 10 s and every batch is 1 update old
    st = run_async(Setup(7, 1, CONSTANT), max_staleness=1, partial=False)
    assert st.ends == pytest.approx([15.0, 25.0, 35.0, 45.0, 55.0, 65.0])
    assert st.staleness == [0, 1, 1, 1, 1, 1]
    f = scale_model.figures(st, 1)
    assert f["steps/h"] == pytest.approx(360.0)
    assert f["generator idle"] == pytest.approx(0.0, abs=1e-9)
    assert f["trainer idle"] == pytest.approx(0.5)


def test_partial_rollouts_keep_the_bound_and_lose_nothing_on_one_turn_trajectories():
    st = run_async(Setup(7, 1, CONSTANT), max_staleness=1, partial=True)
    assert max(st.staleness) <= 1 and st.dropped == 0
    assert st.ends[-1] - st.ends[-2] == pytest.approx(10.0)


def test_paravt_stream_loop_overlaps_like_async_on_one_turn_trajectories():
    # 64 in flight = 8 groups start at 0 (one round: 10 s); batch 0 = 7 of them trains 10-15 s;
    # groups start at each round boundary as the gate allows (7 a batch), every round 10 s:
    # batches end every 10 s, each 1 update old after the first
    st = run_stream(Setup(7, 1, CONSTANT), max_staleness=1)
    assert st.ends == pytest.approx([15.0, 25.0, 35.0, 45.0, 55.0, 65.0])
    assert st.staleness == [0, 1, 1, 1, 1, 1] and st.dropped == 0


def _one_long_group(step: int, prompt: int, index: int) -> Rollout:
    """Group i is step i (1 prompt of 1 rollout): group 1 decodes 1,000 tokens, others 10."""
    return Rollout(step, prompt, index, (Turn(0, 0, 1000 if step == 1 else 10, 0),))


def test_a_too_stale_streaming_group_is_dropped_and_counted():
    # each trajectory on its own (no round barrier); max_staleness 1, one group a batch: groups
    # 0 and 1 start under version 0; 0 ends at 0.1 s and trains (1 s); group 2 starts (version 0
    # still: the load lands after) and trains at version 1; publishing version 2 at 2.2 s dooms
    # group 1 (2 - 0 > 1), still decoding (10 s): dropped, counted once, never trained
    p = replace(
        CONSTANT, prompts=1, group=1, decode_base_s=0.01, update_fixed_s=1.0, steps=3, warmup=1
    )
    p = replace(p, train_tokens_per_s=float("inf"))
    st = run_stream_per_turn(Setup(1, 1, p, drawer=_one_long_group), max_staleness=1)
    assert st.dropped == 1
    assert max(st.staleness) <= 1
    assert st.ends == pytest.approx([1.1, 2.2, 3.3])


def test_the_engine_prefills_first_then_decodes_with_the_kv_cache_term():
    # two requests of 1,000 prompt tokens and 100 new ones; prefill 1,000 tokens/s: A 0-1 s, B
    # 1-2 s; then both decode together, an iteration 0.01 + 1e-5 x (1,050 + 1,050) = 0.031 s
    # (1e-5 s a context token: 1,000 B at 0.1 GB/s; each counted at its middle, 1,000 + 50):
    # 100 iterations, both done at 2 + 3.1 = 5.1 s
    p = replace(
        Params(),
        prefill_tokens_per_s=1000.0,
        vision_s_per_frame=0.0,
        decode_base_s=0.01,
        kv_bytes_per_token=1000,
        hbm_gbps=0.1,
    )
    clock, ends = Clock(), []
    engine = Engine(clock, p)
    for name in ("a", "b"):
        engine.submit(Request(name, 0, Turn(1000, 0, 100, 0), lambda r: ends.append(clock.now)))
    clock.run(lambda: len(ends) == 2)
    assert ends == pytest.approx([5.1, 5.1])
    assert engine.busy_s == pytest.approx(5.1)


def test_the_update_waits_for_the_rank_with_the_most_groups():
    # 7 groups of 100-token trajectories on 6 ranks: rank 0 takes 2 groups (1,600 tokens),
    # at 160 tokens/s 10 s
    trainer = Trainer(Clock(), CONSTANT, ranks=6)
    groups = [[Rollout(0, b, g, (Turn(0, 0, 100, 0),)) for g in range(8)] for b in range(7)]
    assert trainer.update_s(groups) == pytest.approx(10.0)


def test_the_script_ends_with_the_stream_vs_sync_line(capsys):
    assert scale_model.main(["--steps", "4", "--warmup", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("stream vs sync, 1 + 7: ") and last.endswith("x")
