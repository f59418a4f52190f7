"""The engines behind `paravt.rollout.engine`'s contract: transformers, vLLM, scripted."""
