"""The transformers engine keeps only the sampled token's log-prob per step, and its tokens and
log-probs are those of the former path that kept every step's fp32 logits (output_logits)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.rl.logprobs import token_logprobs
from paravt.rollout.engine import GenerationRequest, SamplingParams, request_seeds
from paravt.rollout.engines.hf import TransformersEngine, batch_seed, left_pad
from paravt.rollout.engines.sampled_logprobs import SampledLogprobs


@pytest.fixture(scope="module")
def engine(tiny_qwen3_dir):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)
    return TransformersEngine(model, processor.tokenizer)


def _requests(engine):
    tok = engine.tokenizer
    texts = ["<|im_start|>user\nWhere is the needle?<|im_end|>\n<|im_start|>assistant\n", "Hi"]
    return [GenerationRequest(tuple(tok(t).input_ids)) for t in texts]


def _all_logits_path(engine, requests, params):
    """What the engine did before: every step's fp32 logits kept, scored afterwards."""
    rows = [r.token_ids for r in requests for _ in range(params.n)]
    ids, mask = left_pad(rows, engine.pad_id)
    torch.manual_seed(batch_seed(request_seeds(requests, params)))
    out = engine.model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=params.max_new_tokens,
        do_sample=not params.greedy,
        temperature=None if params.greedy else params.temperature,
        top_k=0 if not params.greedy else None,
        top_p=1.0 if not params.greedy else None,
        suppress_tokens=engine.suppress_ids,
        eos_token_id=engine.stop_ids,
        pad_token_id=engine.pad_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[:, ids.shape[1] :]
    logits = torch.stack(out.logits, dim=1).float()
    return new, token_logprobs(logits, new, params.logprob_temperature, engine.suppress_ids)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=12, temperature=0.7, n=3, seed=5),
        SamplingParams(max_new_tokens=9, temperature=1.3, n=2, seed=11),
        SamplingParams(max_new_tokens=6, greedy=True, seed=0),
    ],
)
def test_tokens_and_logprobs_equal_the_all_logits_path(engine, params):
    requests = _requests(engine)
    seen = {}
    generate = engine.model.generate

    def recording_generate(**kwargs):
        seen.update(kwargs)
        return generate(**kwargs)

    engine.model.generate = recording_generate
    try:
        got = engine.generate(requests, params)
    finally:
        del engine.model.generate
    assert not seen.get("output_logits") and not seen.get("output_scores")
    new, logp = _all_logits_path(engine, requests, params)
    flat = [o for group in got for o in group]
    assert len(flat) == new.shape[0]
    for i, o in enumerate(flat):
        k = len(o.token_ids)
        assert list(o.token_ids) == new[i, :k].tolist()
        torch.testing.assert_close(torch.tensor(o.logprobs), logp[i, :k], rtol=0, atol=1e-6)
        assert all(lp <= 0 for lp in o.logprobs)


def test_processor_holds_one_step_and_checks_its_step_count():
    rec = SampledLogprobs(0.5, [2])
    ids = torch.tensor([[1], [3]])
    scores = torch.randn(2, 5)
    z = rec(ids, scores)
    assert torch.isneginf(z[:, 2]).all() and torch.allclose(z[:, 0], scores[:, 0] / 0.5)
    rec(torch.tensor([[1, 4], [3, 0]]), torch.randn(2, 5))
    assert len(rec._taken) == 1 and rec._last.shape == (2, 5)
    want0 = torch.log_softmax(z, -1)[torch.arange(2), torch.tensor([4, 0])]
    out = rec.finish(torch.tensor([[4, 1], [0, 3]]))
    torch.testing.assert_close(out[:, 0], want0)
    with pytest.raises(RuntimeError, match="decoding steps"):
        rec.finish(torch.tensor([[4, 1, 1], [0, 3, 3]]))
    with pytest.raises(ValueError, match="temperature"):
        SampledLogprobs(0.0)
