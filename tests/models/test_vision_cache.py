"""The vision feature cache (paravt.models.vision_cache) on the real tiny Qwen-VL models.

Sibling trajectories (a group of 2 teacher rollouts: the same overview, the same crops) go through
the trainer's padded and packed log-prob passes with the cache off and on: the log-probs agree
within 1e-6 while the tower sees each distinct clip once. A trainable tower is never cached under
autograd, and no feature survives a weight update of the tower.
"""

from __future__ import annotations

import copy

import pytest
import torch

from paravt.data.packing import model_rope_index
from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.models.loading import PolicySpec, load_policy, vision_tower
from paravt.models.vision_cache import feature_cache, install_feature_cache
from paravt.modules.packed_forward import packed_trajectory_logprobs


def siblings(processor, samples, group: int = 2):
    """`group` teacher rollouts of each sample: the same overview and the same crop windows."""
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.scripts import needle_teacher
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    teacher = ScriptedEngine(processor.tokenizer, needle_teacher(samples, "search"))
    loop = AgentLoop(teacher, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=2))
    return list(loop.run(samples, [4] * len(samples), group, SamplingParams(greedy=True)))


def clips(trajs) -> tuple[int, int]:
    """(clips in all trajectories, distinct clips by content)."""
    seen = [
        (v.video_grid_thw.tolist(), v.pixel_values_videos.sum().item())
        for t in trajs
        for v in t.visuals
    ]
    return len(seen), len({repr(s) for s in seen})


def logprobs(model, trajs, ids, packed: bool) -> torch.Tensor:
    with torch.no_grad():
        if packed:
            return packed_trajectory_logprobs(model, trajs, ids, model_rope_index(model))[0]
        return trajectory_logprobs(model, trajs, ids)[0]


@pytest.mark.parametrize("arch", ["qwen3", "qwen25"])
def test_cached_log_probs_equal_uncached(arch, request, needle_samples):
    path = request.getfixturevalue(f"tiny_{arch}_dir")
    model, processor = load_policy(PolicySpec(path=str(path)))
    trajs = siblings(processor, needle_samples[:2])
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    total, distinct = clips(trajs)
    assert distinct < total  # the siblings really share clips
    cache = install_feature_cache(model, 1 << 30, enabled=False)
    off = {p: logprobs(model, trajs, ids, p) for p in (False, True)}
    assert cache.take_stats()[:2] == (0, 2 * total)  # every clip through the tower, twice
    cache.enabled = True
    # Two micro-batches (the first half, then all): the second reuses what the first computed.
    logprobs(model, trajs[: len(trajs) // 2], ids, False)
    cache.take_stats()
    on = {p: logprobs(model, trajs, ids, p) for p in (False, True)}
    for packed in (False, True):
        assert torch.allclose(on[packed], off[packed], atol=1e-6, rtol=0), packed
    assert len(cache) == distinct  # each distinct clip went through the tower once
    hits, misses, _ = cache.take_stats()
    assert hits == 2 * total - misses and misses < distinct


def test_trained_tower_never_reuses_features_across_an_update(tiny_qwen3_dir, needle_samples):
    model, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir), freeze_vision=False))
    trajs = siblings(processor, needle_samples[:1])
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    plain = copy.deepcopy(model)  # no cache: the reference figures
    cache = install_feature_cache(model, 1 << 30)
    assert feature_cache(plain) is None
    copied = copy.deepcopy(model)
    assert feature_cache(copied) is not cache and len(feature_cache(copied)) == 0
    # Under autograd the trainable tower's features are never stored.
    logp, _, _ = trajectory_logprobs(model, trajs, ids)
    assert len(cache) == 0 and cache.take_stats()[0] == 0
    logp[:, 1:].sum().backward()
    assert vision_tower(model).patch_embed.proj.weight.grad is not None  # the tower trains
    # Without autograd they are cached, until the tower's weights change.
    logprobs(model, trajs, ids, False)
    assert len(cache) > 0
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    opt.step()
    with torch.no_grad():
        for a, b in zip(model.parameters(), plain.parameters(), strict=True):
            b.copy_(a)
    cache.take_stats()
    after = logprobs(model, trajs, ids, False)
    _, distinct = clips(trajs)
    assert cache.take_stats()[1] == distinct  # every clip recomputed by the updated tower
    assert torch.allclose(after, logprobs(plain, trajs, ids, False), atol=1e-6, rtol=0)


@pytest.mark.parametrize("key", ["feature_bytes", "crop_bytes"])
def test_a_negative_bound_is_named(key):
    from paravt.modules.rollout_datamodule import VisionCacheConfig

    with pytest.raises(ValueError, match=rf"rollout\.vision_cache\.{key} must be >= 0"):
        VisionCacheConfig(**{key: -1})
