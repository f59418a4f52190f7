"""Packing: per-example positions and isolation, checked against examples run one by one."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.agent.loop import AgentConfig
from paravt.agent.render import ChatRenderer
from paravt.data.packing import (
    example_positions,
    model_rope_index,
    pack_batch,
    pad_batch,
    plan_packs,
)
from paravt.data.sft_encode import SFTEncoder
from paravt.data.sft_schema import parse_row
from paravt.data.sft_writer import teacher_rows
from paravt.models.forward import TokenIds
from paravt.modules.sft import batch_logprobs, sft_stats
from paravt.video.reader import VideoReader


def test_plan_packs_first_fit_in_order():
    # 5 -> row0 (5), 4 -> row1 (4), 3 -> row0 (8), 2 -> row1 (6), 9 alone (over the cap)
    assert plan_packs([5, 4, 3, 2, 9], 8) == [[0, 2], [1, 3], [4]]


@pytest.fixture(scope="module")
def setup(tiny_qwen3_dir, needle_samples):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir).eval()
    rows = teacher_rows(needle_samples[:3], processor, AgentConfig(max_rounds=2), budgets=(4, 8))
    rows.append(  # a text-only row without visuals packs beside the video rows
        {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "<answer>4</answer>"},
            ]
        }
    )
    encoder = SFTEncoder(ChatRenderer(processor), VideoReader())
    examples = [encoder.encode(parse_row(r, i)) for i, r in enumerate(rows)]
    return model, TokenIds.from_tokenizer(processor.tokenizer), examples


def _alone(model, ids, examples):
    out = []
    for e in examples:
        b = pad_batch([e], ids.pad, ids.image, ids.video)
        logp, greedy = batch_logprobs(model, b, ids)
        out.append(sft_stats(logp, greedy, b, 1).per_example[0])
    return torch.stack(out)


@torch.no_grad()
def test_packed_batch_gives_the_per_example_losses_of_the_examples_alone(setup):
    model, ids, examples = setup
    alone = _alone(model, ids, examples)
    packed = pack_batch(examples, model_rope_index(model), 10**6, ids.pad, ids.image, ids.video)
    assert packed.input_ids.shape[0] == 1 and len(packed.visuals) > 4
    logp, greedy = batch_logprobs(model, packed, ids)
    got = sft_stats(logp, greedy, packed, len(examples)).per_example
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)
    # Several rows with row padding (a cap that fits two examples per row at most).
    cap = max(e.num_tokens for e in examples) * 2
    rows = pack_batch(examples, model_rope_index(model), cap, ids.pad, ids.image, ids.video)
    logp, greedy = batch_logprobs(model, rows, ids)
    got = sft_stats(logp, greedy, rows, len(examples)).per_example
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_without_isolation_the_losses_differ(setup):
    """The check above can fail: one sequence of positions over the pack changes the losses."""
    model, ids, examples = setup
    packed = pack_batch(examples, model_rope_index(model), 10**6, ids.pad, ids.image, ids.video)
    width = packed.input_ids.shape[1]
    leaky = torch.zeros_like(packed.position_ids)
    leaky[0] = torch.arange(width)  # no restart: attention runs across examples
    leaky[1:] = packed.position_ids[1:]
    from dataclasses import replace

    logp, greedy = batch_logprobs(model, replace(packed, position_ids=leaky), ids)
    got = sft_stats(logp, greedy, packed, len(examples)).per_example
    assert (got[1:] - _alone(model, ids, examples)[1:]).abs().max() > 1e-3


def test_mrope_positions_are_those_of_the_model_on_the_example_alone(setup):
    model, ids, examples = setup
    e = examples[0]
    pos = example_positions(e, model_rope_index(model), ids.image, ids.video)
    b = pad_batch([e], ids.pad, ids.image, ids.video)
    from paravt.models.qwen_vl import visual_kwargs

    grid = visual_kwargs(b.visuals, "cpu")["video_grid_thw"]
    ref, _ = model.model.get_rope_index(b.input_ids, b.mm_token_type_ids, video_grid_thw=grid)
    assert torch.equal(pos[1:], ref[:, 0])
    assert torch.equal(pos[0], torch.arange(e.num_tokens))
    # Video tokens share temporal/height/width positions, so M-RoPE differs from text positions.
    assert not torch.equal(pos[1], pos[0])


def test_sft_stats_equal_the_full_logits_computation_with_gradients(setup):
    """The SFT pass scores only trained tokens through the chunked lm_head; its loss, answer
    metrics and every gradient equal those computed from the model's full logits."""
    from paravt.rl.logprobs import causal_token_logprobs

    model, ids, examples = setup
    batch = pad_batch(examples, ids.pad, ids.image, ids.video)
    params = [p for p in model.parameters() if p.requires_grad]
    logp, greedy = batch_logprobs(model, batch, ids, chunk_size=7)
    got = sft_stats(logp, greedy, batch, len(examples))
    from paravt.models.qwen_vl import visual_kwargs

    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        mm_token_type_ids=batch.mm_token_type_ids,
        use_cache=False,
        **visual_kwargs(batch.visuals, "cpu"),
    ).logits
    ref_logp = causal_token_logprobs(logits, batch.input_ids, 1.0, ids.suppress)
    mask, answer = batch.loss_mask, batch.answer_mask & batch.loss_mask
    assert answer.any()
    ref_loss = -ref_logp[mask].mean()
    z = logits.float().index_fill(-1, torch.tensor(ids.suppress), float("-inf"))
    hits = z[:, :-1].argmax(-1) == batch.input_ids[:, 1:]
    torch.testing.assert_close(got.loss, ref_loss)
    torch.testing.assert_close(got.answer_loss, -ref_logp[answer].mean())
    torch.testing.assert_close(got.answer_accuracy, hits[answer[:, 1:]].float().mean())
    want = torch.autograd.grad(ref_loss, params, allow_unused=True)
    have = torch.autograd.grad(got.loss, params, allow_unused=True)
    for g, w in zip(have, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
