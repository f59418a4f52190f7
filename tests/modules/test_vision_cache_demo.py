"""The demo learns the same with the vision cache on (`rollout.vision_cache`, the default) as off.

Two RL steps of experiment=demo (scaled to the session's tiny model, G=2, in float64) from the
same seed, cache off and on: the same rollouts (tokens and behaviour log-probs), rewards,
losses, gradient norms and final weights, while the cache served most clips (the G siblings
share the overview, and the update reuses the rollout's features).
"""

from __future__ import annotations

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.modules.test_grpo_training import CPU_SCALE, compose_cfg, local_paths

# Float64, so that "the same" holds on any CPU: the cache batches clips differently, so sums
# reassociate, by ~1e-6 in float32 on some CPU models (AVX-512/AMX kernels); Adam then turns a
# rounding-sized difference in a gradient near zero into an lr-sized step (3e-4 seen in float32).
# In float64 a reassociated sum moves by ~1e-16 of its terms, and Adam's step on such noise
# is about lr * 1e-16 / eps = 1e-12 (eps 1e-8): 1e-9 leaves a thousandfold margin and still
# catches any real difference (a changed token or feature moves log-probs by > 1e-4).
ATOL = 1e-9
LEARNING = ("reward/mean", "loss/loss", "loss/entropy", "loss/approx_kl", "grad_norm")


def two_steps(tmp_path, tiny_dir, needle_dir, enabled: bool):
    from paravt.run.build import build_run

    scale = [o for o in CPU_SCALE if not o.startswith("callbacks.")]
    off = ["callbacks.benchmark_validation=null", "callbacks.rollout_logger=null"]
    flag = f"rollout.vision_cache.enabled={str(enabled).lower()}"
    paths = local_paths(tmp_path, tiny_dir, needle_dir)
    cfg = compose_cfg(["experiment=demo", *scale, *off, flag, "model.dtype=float64", *paths])
    run = build_run(cfg)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    scalars = {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    return run, scalars


def test_demo_learning_figures_are_unchanged_with_the_cache(tmp_path, tiny_qwen3_dir, needle_dir):
    run_off, off = two_steps(tmp_path / "off", tiny_qwen3_dir, needle_dir, False)
    run_on, on = two_steps(tmp_path / "on", tiny_qwen3_dir, needle_dir, True)
    for a, b in zip(
        run_off.module.last_rollout.trajectories,
        run_on.module.last_rollout.trajectories,
        strict=True,
    ):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=ATOL)
    for tag in LEARNING:
        assert len(off[tag]) == 2
        # Logged as float32: the same float64 value rounds to the same float32, give or take one
        # spacing (6e-8 relative).
        assert torch.allclose(torch.tensor(off[tag]), torch.tensor(on[tag]), rtol=1e-6), tag
    weights_off = run_off.module.policy.state_dict()
    for name, value in run_on.module.policy.state_dict().items():
        assert value.dtype == torch.float64, name
        assert torch.allclose(value, weights_off[name], rtol=0.0, atol=ATOL), name
    # Off: every clip through the tower; on: the G=2 siblings and the update shared them.
    assert off["vision_cache/feature_hit_rate"] == [0.0, 0.0]
    assert min(on["vision_cache/feature_hit_rate"]) >= 0.5
    for encoded_on, encoded_off in zip(
        on["vision_cache/tower_clips"], off["vision_cache/tower_clips"], strict=True
    ):
        assert 0 < encoded_on < encoded_off
    assert all(t > 0 for t in off["time/rollout_vision"] + off["time/update_vision"])
