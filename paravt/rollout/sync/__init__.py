"""Trainer weights to rollout engines: when and how they sync, shared copies, staleness."""
