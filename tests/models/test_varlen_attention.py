"""The varlen attention equals transformers' dense block-diagonal masked sdpa, on the real tiny
Qwen3-VL and Qwen2.5-VL: one attention layer and the whole packed forward (with video tokens
and their M-RoPE positions, segments of 1 and 2 tokens), values and every gradient; no dense
mask is built; the switch is restored, leaves vision, eager and flash configs alone, and is
result-neutral for padded passes and generation."""

from __future__ import annotations

import random
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import create_causal_mask, find_packed_sequence_indices

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import needle_teacher
from paravt.data.packing import model_rope_index
from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.models.varlen_attention import (
    VARLEN,
    segment_lengths,
    text_config,
    varlen_active,
    varlen_attention,
    varlen_sdpa_forward,
)
from paravt.modules.packed_forward import packed_trajectory_logprobs
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.types import Trajectory
from paravt.video.reader import VideoReader


def test_segment_lengths_by_hand_and_as_transformers_finds_them():
    # starts at 0, 3 (0 after 2), 5 (0 after 1), 6 (5 after 0: not +1): [3, 2, 1, 2]
    assert segment_lengths(torch.tensor([0, 1, 2, 0, 1, 0, 5, 6])) == [3, 2, 1, 2]
    assert segment_lengths(torch.tensor([4, 5, 6])) == [3]
    assert segment_lengths(torch.tensor([0, 0, 0])) == [1, 1, 1]
    rng = random.Random(1)
    for _ in range(20):
        lengths = [rng.randint(1, 6) for _ in range(rng.randint(1, 6))]
        pos = torch.cat([torch.arange(n) for n in lengths]).view(1, -1)
        assert segment_lengths(pos[0]) == lengths
        ids = find_packed_sequence_indices(pos)  # transformers' [1, L] sequence index
        want = torch.bincount(ids[0]).tolist() if ids is not None else [pos.shape[1]]
        assert segment_lengths(pos[0]) == want


@pytest.fixture(scope="module", params=["qwen3", "qwen25"])
def setup(request, needle_samples):
    path = request.getfixturevalue(f"tiny_{request.param}_dir")
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path).float()
    teacher = ScriptedEngine(processor.tokenizer, needle_teacher(needle_samples, "search"))
    loop = AgentLoop(teacher, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=1))
    trajs = list(loop.run(needle_samples[:2], [4, 4], 1, SamplingParams(greedy=True)))
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    rng = random.Random(0)
    words = _words(processor, ids)
    for i, n in enumerate((1, 9, 2)):  # text rows between the video rows; segments of 1 and 2
        toks = tuple(rng.choice(words) for _ in range(n))
        trajs.insert(2 * i, Trajectory(f"t{i}", 0, toks, (1,) * n, (0.0,) * n, (), 0))
    return model, processor, ids, trajs


def _words(processor, ids: TokenIds) -> list[int]:
    special = set(processor.tokenizer.all_special_ids) | {ids.image, ids.video, *ids.suppress}
    return [i for i in range(len(processor.tokenizer)) if i not in special]


def _attn_inputs(module, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    heads, kv = module.config.num_attention_heads, module.config.num_key_value_heads
    dim = module.head_dim
    length = sum(lengths)
    q = torch.randn(1, heads, length, dim, generator=g, requires_grad=True)
    k = torch.randn(1, kv, length, dim, generator=g, requires_grad=True)
    v = torch.randn(1, kv, length, dim, generator=g, requires_grad=True)
    pos = torch.cat([torch.arange(n) for n in lengths]).view(1, -1)
    return q, k, v, pos


@pytest.mark.parametrize("lengths", [[5, 1, 7, 2, 1], [1, 1, 1], [12]])
def test_one_layer_equals_the_dense_block_diagonal_mask(setup, lengths):
    model = setup[0]
    attn = model.get_decoder().layers[0].self_attn
    q, k, v, pos = _attn_inputs(attn, lengths, sum(lengths))
    hidden = torch.zeros(1, q.shape[2], 1)
    mask = create_causal_mask(text_config(model), hidden, None, None, position_ids=pos)
    if len(lengths) > 1:  # transformers' own packed mask: dense, block-diagonal
        assert mask.shape == (1, 1, q.shape[2], q.shape[2])
    dense, _ = sdpa_attention_forward(attn, q, k, v, mask, scaling=attn.scaling)
    with varlen_attention(model):  # under the varlen name transformers builds no mask
        assert create_causal_mask(text_config(model), hidden, None, None, position_ids=pos) is None
    var, _ = varlen_sdpa_forward(attn, q, k, v, None, scaling=attn.scaling, position_ids=pos)
    torch.testing.assert_close(var, dense, atol=1e-6, rtol=1e-5)
    w = torch.randn(dense.shape, generator=torch.Generator().manual_seed(7))
    want = torch.autograd.grad((dense * w).sum(), (q, k, v))
    got = torch.autograd.grad((var * w).sum(), (q, k, v))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def _packed(model, ids, trajs, varlen: bool):
    """(logp, entropy, padded batch, grads) of one packed forward + a fixed backward."""
    rope = model_rope_index(model)
    params = [p for p in model.parameters() if p.requires_grad]
    with varlen_attention(model) if varlen else nullcontext():
        logp, batch, ent = packed_trajectory_logprobs(model, trajs, ids, rope, 0.8, True)
        w = torch.randn(logp.shape, generator=torch.Generator().manual_seed(3))
        loss = torch.where(batch.loss_mask, logp * w + ent * w.flip(1), 0.0).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return logp.detach(), ent.detach(), batch, grads


def test_packed_forward_equals_the_dense_mask_with_video_and_gradients(setup):
    model, _, ids, trajs = setup
    assert sum(bool(t.visuals) for t in trajs) == 2 and min(len(t.token_ids) for t in trajs) == 1
    if model.config.model_type == "qwen2_5_vl":  # M-RoPE with the clips' real timing
        assert all(v.second_per_grid_ts is not None for t in trajs for v in t.visuals)
    vision = model.config.vision_config._attn_implementation
    d_logp, d_ent, batch, d_grads = _packed(model, ids, trajs, varlen=False)
    v_logp, v_ent, _, v_grads = _packed(model, ids, trajs, varlen=True)
    assert text_config(model)._attn_implementation == "sdpa"  # restored
    assert model.config.vision_config._attn_implementation == vision
    inside = batch.attention_mask.bool()
    finite = torch.isfinite(d_logp) & inside
    assert torch.equal(finite, torch.isfinite(v_logp) & inside)
    torch.testing.assert_close(v_logp[finite], d_logp[finite], atol=1e-5, rtol=0)
    torch.testing.assert_close(v_ent[inside], d_ent[inside], atol=1e-5, rtol=0)
    compared = 0
    for got, want in zip(v_grads, d_grads, strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            compared += int(want.abs().sum() > 0)
    assert compared > len(v_grads) // 2


@torch.no_grad()
def test_segments_are_read_once_per_forward_not_per_layer(setup, monkeypatch):
    from paravt.models import varlen_attention as va

    model, _, ids, trajs = setup
    rope = model_rope_index(model)
    reads = []
    real = va.segment_lengths
    monkeypatch.setattr(va, "segment_lengths", lambda p: reads.append(1) or real(p))
    with varlen_attention(model):
        got = packed_trajectory_logprobs(model, trajs, ids, rope)[0]
        rows = len(reads)
        again = packed_trajectory_logprobs(model, trajs, ids, rope)[0]  # new positions
    assert len(model.get_decoder().layers) > 1 and rows == 1  # one packed row, all layers
    assert len(reads) == 2 * rows
    want = packed_trajectory_logprobs(model, trajs, ids, rope)[0]  # the dense-mask sdpa
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], atol=1e-5, rtol=0)
    assert torch.equal(got, again)


@torch.no_grad()
def test_no_leak_across_trajectories(setup):
    """Changing one trajectory's tokens changes its own log-probs and no other's."""
    model, processor, ids, trajs = setup
    rope = model_rope_index(model)
    words = _words(processor, ids)
    victim = max(range(len(trajs)), key=lambda i: len(trajs[i].token_ids) * (not trajs[i].visuals))
    changed = tuple(words[(words.index(x) + 7) % len(words)] for x in trajs[victim].token_ids)
    other = list(trajs)
    other[victim] = replace(trajs[victim], token_ids=changed)
    with varlen_attention(model):
        a = packed_trajectory_logprobs(model, trajs, ids, rope)[0]
        b = packed_trajectory_logprobs(model, other, ids, rope)[0]
    keep = [i for i in range(len(trajs)) if i != victim]
    torch.testing.assert_close(a[keep], b[keep], atol=1e-6, rtol=0)
    assert (a[victim] - b[victim]).abs().max() > 1e-3


@torch.no_grad()
def test_padded_passes_and_generation_are_unchanged_inside_the_context(setup):
    model, processor, ids, trajs = setup
    padded = trajectory_logprobs(model, trajs, ids)[0]
    prompt = processor.tokenizer(["a b c", "d e f g h"], return_tensors="pt", padding=True)
    gen = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    with varlen_attention(model):
        assert varlen_active(model)
        assert torch.equal(trajectory_logprobs(model, trajs, ids)[0], padded)
        assert torch.equal(model.generate(**prompt, max_new_tokens=5, do_sample=False), gen)
    assert not varlen_active(model)


def test_switch_is_restored_on_error_and_leaves_other_attentions_alone(setup):
    model = setup[0]
    config = text_config(model)
    with pytest.raises(ZeroDivisionError), varlen_attention(model, model):  # shared config
        assert config._attn_implementation == VARLEN
        with varlen_attention(model):  # re-entrant: the inner exit restores nothing
            pass
        assert config._attn_implementation == VARLEN
        _ = 1 / 0
    assert config._attn_implementation == "sdpa"
    for other in ("eager", "flash_attention_2"):
        config._attn_implementation_internal = other  # set without loading flash-attn
        try:
            with varlen_attention(model):
                assert config._attn_implementation == other
        finally:
            config._attn_implementation_internal = "sdpa"


def test_checkpointed_backward_outside_the_context_is_refused(setup):
    """Gradient checkpointing recomputes in backward, dispatching attention by name again: in
    the context it gives the plain backward's gradients; after it, an error, never a leak."""
    model, _, ids, trajs = setup
    rope = model_rope_index(model)
    params = [p for p in model.parameters() if p.requires_grad]
    with varlen_attention(model):
        logp = packed_trajectory_logprobs(model, trajs, ids, rope)[0]
        want = torch.autograd.grad(logp.sum(), params, allow_unused=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    try:
        with varlen_attention(model):
            logp = packed_trajectory_logprobs(model, trajs, ids, rope)[0]
            got = torch.autograd.grad(logp.sum(), params, allow_unused=True)
            late = packed_trajectory_logprobs(model, trajs, ids, rope)[0]
        with pytest.raises(RuntimeError, match="over the backward too"):
            late.sum().backward()
    finally:
        model.gradient_checkpointing_disable()
        model.eval()
        model.zero_grad(set_to_none=True)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
