"""The transformers engine samples from the distribution paravt states, whatever the checkpoint's
generation config says: a repetition penalty, min-p or n-gram ban in `generation_config.json` must
not reach the samples or the recorded log-probs, which the trainer recomputes without them."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, GenerationConfig

from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.rollout.engine import GenerationRequest, SamplingParams
from paravt.rollout.engines.hf import TransformersEngine
from paravt.types import Trajectory

PARAMS = SamplingParams(max_new_tokens=10, temperature=0.8, n=2, seed=3)
PROMPT = "<|im_start|>user\nWhere is the needle?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def parts(tiny_qwen3_dir):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir).eval()
    return model, processor


def _generate(model, processor, knobs: dict):
    """The engine's outputs with `knobs` in the checkpoint's generation config."""
    saved = model.generation_config
    model.generation_config = GenerationConfig(**knobs)
    try:
        engine = TransformersEngine(model, processor.tokenizer)
        request = GenerationRequest(tuple(processor.tokenizer(PROMPT).input_ids))
        (group,) = engine.generate([request], PARAMS)
    finally:
        model.generation_config = saved
    assert model.generation_config is saved  # the engine put the checkpoint's config back
    return request, group


def _trainer_logprobs(model, processor, request, out) -> torch.Tensor:
    """The trainer's teacher-forced log-probs of `out`'s tokens (its own forward pass)."""
    n = len(out.token_ids)
    traj = Trajectory(
        sample_id="s",
        group_index=0,
        token_ids=request.token_ids + out.token_ids,
        loss_mask=(0,) * len(request.token_ids) + (1,) * n,
        logprobs=(0.0,) * len(request.token_ids) + out.logprobs,
        visuals=(),
        prompt_length=len(request.token_ids),
    )
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    with torch.no_grad():
        logp, _, _ = trajectory_logprobs(model, [traj], ids, PARAMS.temperature)
    return logp[0, -n:]


def test_checkpoint_sampling_knobs_do_not_reach_samples_or_logprobs(parts):
    model, processor = parts
    # A penalty strong enough to move every repeated token's log-prob, and a min-p that would
    # truncate the sampling distribution after the engine has recorded its log-probs.
    knobs = {"repetition_penalty": 1.3, "min_p": 0.5, "no_repeat_ngram_size": 1}
    request, skewed = _generate(model, processor, knobs)
    _, plain = _generate(model, processor, {})
    assert [o.token_ids for o in skewed] == [o.token_ids for o in plain]
    for out in skewed:
        want = _trainer_logprobs(model, processor, request, out)
        torch.testing.assert_close(torch.tensor(out.logprobs), want, rtol=0, atol=2e-4)
