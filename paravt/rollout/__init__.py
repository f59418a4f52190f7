"""Rollout engines: the contract, the factory, and by role: engines/ (transformers, vLLM,
scripted), serving/ (rollout servers), sync/ (weights to engines).

`build_engine(cfg, model, processor)` is the one way to make an engine from a config.
"""

from paravt.rollout.engine import (
    EngineConfig,
    GenerationOutput,
    GenerationRequest,
    RolloutEngine,
    SamplingParams,
)
from paravt.rollout.factory import ENGINES, build_engine

__all__ = [
    "ENGINES",
    "EngineConfig",
    "GenerationOutput",
    "GenerationRequest",
    "RolloutEngine",
    "SamplingParams",
    "build_engine",
]
