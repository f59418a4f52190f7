"""`check_context`: a vLLM context longer than the checkpoint's position range is refused before
the engine starts, naming the paravt key to lower (vLLM's own refusal comes a minute later and
names its variables, not paravt's)."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, PretrainedConfig

from paravt.rollout.factory import check_context


def test_a_context_above_the_checkpoints_range_names_the_key_to_lower(tiny_qwen3_dir):
    config = AutoConfig.from_pretrained(tiny_qwen3_dir)
    limit = config.text_config.max_position_embeddings
    check_context(limit, config)  # equal: fits
    check_context(limit // 2, config)
    with pytest.raises(ValueError) as err:
        check_context(65536, config)  # evaluation's default protocol
    assert f"rollout.agent.max_total_tokens={limit} or lower" in str(err.value)
    assert f"context of {limit} tokens" in str(err.value)


def test_a_flat_config_and_a_config_without_a_range(tiny_qwen25_dir):
    text = AutoConfig.from_pretrained(tiny_qwen25_dir).text_config  # no text_config of its own
    with pytest.raises(ValueError, match="max_position_embeddings"):
        check_context(text.max_position_embeddings + 1, text)
    check_context(text.max_position_embeddings, text)
    check_context(10**9, PretrainedConfig())  # no range in the config: vLLM decides
