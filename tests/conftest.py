"""Shared fixtures: tiny checkpoints built once per test session (nothing is downloaded)."""

from __future__ import annotations

import pytest

from paravt.models.tiny import TinyModelConfig, build_tiny_model


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_vl"), TinyModelConfig("qwen3_vl"))


@pytest.fixture(scope="session")
def tiny_qwen25_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny_qwen2_5_vl"), TinyModelConfig("qwen2_5_vl")
    )
