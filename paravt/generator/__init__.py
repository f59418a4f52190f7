"""The asynchronous rollout generator: its process, messages, partial rollouts, DataModule side."""
