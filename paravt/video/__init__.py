"""Video layer: frame sampling (pure), decord-backed reading, synthetic needle videos."""
