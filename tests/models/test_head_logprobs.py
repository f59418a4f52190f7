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
from paravt.models.head_logprobs import head_logprobs
from paravt.rl.logprobs import causal_token_logprobs
from paravt.rl.losses import entropy_from_logits
from paravt.rollout.engine import SamplingParams
from paravt.rollout.hf import mm_token_type_ids, visual_kwargs
from paravt.rollout.scripted import ScriptedEngine
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
