"""The trainer's log-prob pass through the chunked lm_head equals the full-logits path on the
real tiny Qwen3-VL: values, entropy and every parameter's gradient (fp32, 1e-5), with video."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import needle_teacher
from paravt.models.forward import TokenIds, pad_trajectories, trajectory_logprobs
from paravt.models.head_logprobs import head_logprobs, shift_head_greedy
from paravt.rl.logprobs import causal_token_logprobs
from paravt.rl.losses import entropy_from_logits
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.hf import mm_token_type_ids, visual_kwargs
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader


@pytest.fixture(scope="module")
def model_and_trajs(tiny_qwen3_dir, needle_samples):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir).float()
    teacher = ScriptedEngine(processor.tokenizer, needle_teacher(needle_samples, "search"))
    loop = AgentLoop(teacher, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=2))
    trajs = loop.run(needle_samples[:3], [4, 4, 4], 1, SamplingParams(greedy=True))
    return model, TokenIds.from_tokenizer(processor.tokenizer), trajs


def _full_logits_path(model, trajs, ids, temp):
    batch = pad_trajectories(trajs, ids.pad)
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        mm_token_type_ids=mm_token_type_ids(batch.input_ids, ids.image, ids.video),
        use_cache=False,
        **visual_kwargs([v for t in trajs for v in t.visuals], "cpu"),
    )
    logp = causal_token_logprobs(out.logits, batch.input_ids, temp, ids.suppress)
    z = (out.logits.float() / temp).index_fill(-1, torch.tensor(ids.suppress), float("-inf"))
    ent = torch.cat([torch.zeros(len(trajs), 1), entropy_from_logits(z)[:, :-1]], 1)
    return logp, ent, batch


@pytest.mark.parametrize("temp,chunk", [(1.0, 7), (0.7, 4096)])
def test_trajectory_logprobs_equal_full_logits_with_gradients(model_and_trajs, temp, chunk):
    model, ids, trajs = model_and_trajs
    assert any(t.visuals for t in trajs)
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(int(temp * 10) + chunk)

    ref_logp, ref_ent, batch = _full_logits_path(model, trajs, ids, temp)
    mask = batch.loss_mask
    w = torch.randn(mask.shape, generator=g)
    w_ent = torch.randn(mask.shape, generator=g)

    def objective(logp, ent):
        return torch.where(mask, logp * w + ent * w_ent, 0.0).sum()

    ref_grads = torch.autograd.grad(objective(ref_logp, ref_ent), params, allow_unused=True)
    logp, _, ent = trajectory_logprobs(model, trajs, ids, temp, True, chunk)
    grads = torch.autograd.grad(objective(logp, ent), params, allow_unused=True)
    torch.testing.assert_close(torch.where(mask, logp, 0), torch.where(mask, ref_logp, 0))
    torch.testing.assert_close(torch.where(mask, ent, 0), torch.where(mask, ref_ent, 0))
    compared = 0
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            compared += int(want.abs().sum() > 0)
    assert compared > len(params) // 2  # the gradient reached most of the model


def test_lm_head_is_restored_and_logits_are_back_after_the_context(model_and_trajs):
    model, ids, trajs = model_and_trajs
    head = model.get_output_embeddings()
    ids_t = pad_trajectories(trajs[:1], ids.pad).input_ids
    with head_logprobs(model, ids_t, 1.0, ids.suppress, 16, False):
        assert "forward" in vars(head)
    assert "forward" not in vars(head)
    with torch.no_grad():
        out = model(input_ids=ids_t[:, :8], use_cache=False)
    assert out.logits.shape[-1] == head.weight.shape[0]


def test_only_trained_scores_the_trained_tokens_with_the_full_paths_gradients(model_and_trajs):
    """`only_trained`: the lm_head runs on the trained tokens alone; there the values and every
    parameter's gradient equal the full pass's, elsewhere logp and entropy are 0."""
    model, ids, trajs = model_and_trajs
    params = [p for p in model.parameters() if p.requires_grad]
    full, batch, full_ent = trajectory_logprobs(model, trajs, ids, 0.7, True, 5)
    part, _, part_ent = trajectory_logprobs(model, trajs, ids, 0.7, True, 5, only_trained=True)
    mask = batch.loss_mask
    assert 0 < int(mask.sum()) < int(batch.attention_mask.sum())  # some tokens are not trained
    torch.testing.assert_close(part[mask], full[mask])
    torch.testing.assert_close(part_ent[mask], full_ent[mask])
    assert not part[~mask].any() and not part_ent[~mask].any()
    w = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))

    def grads(logp, ent):
        loss = torch.where(mask, logp * w + ent, 0.0).sum()
        return torch.autograd.grad(loss, params, allow_unused=True)

    for got, want in zip(grads(part, part_ent), grads(full, full_ent), strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_greedy_channel_is_the_argmax_of_the_suppressed_logits(model_and_trajs):
    """Six greedily decoded tokens after a text prefix are argmax hits by construction; the
    prefix's own tokens, under this random model, are not; nothing outside `greedy_at`."""
    model, ids, trajs = model_and_trajs
    sup = torch.tensor(ids.suppress)
    seq = torch.tensor([[t for t in trajs[0].token_ids[:40] if t not in ids.suppress][:24]])
    with torch.no_grad():
        for _ in range(6):
            z = model(input_ids=seq, use_cache=False).logits[:, -1].float()
            seq = torch.cat([seq, z.index_fill(-1, sup, float("-inf")).argmax(-1, keepdim=True)], 1)
        at = torch.zeros_like(seq, dtype=torch.bool)
        at[:, 12:] = True
        with head_logprobs(model, seq, 1.0, ids.suppress, 3, False, at, at):
            greedy = shift_head_greedy(model(input_ids=seq, use_cache=False).logits)
        z = model(input_ids=seq, use_cache=False).logits.float().index_fill(-1, sup, float("-inf"))
    want = torch.zeros_like(at)
    want[:, 1:] = z[:, :-1].argmax(-1) == seq[:, 1:]
    assert want[0, -6:].all() and not want[0, 12:-6].all()
    assert torch.equal(greedy[at], want[at])
    assert not greedy[~at].any()


def test_a_mask_of_the_wrong_shape_is_refused(model_and_trajs):
    model, ids, trajs = model_and_trajs
    ids_t = pad_trajectories(trajs[:1], ids.pad).input_ids
    bad = ids_t[:, 1:] > 0
    with (
        pytest.raises(ValueError, match=r"at \(1, \d+\) must match input_ids"),
        head_logprobs(model, ids_t, 1.0, ids.suppress, 16, False, at=bad),
    ):
        pass
