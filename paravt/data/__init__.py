"""RL prompt data: raw rows -> Samples (schemas, pure) and file loading (datasets, glue)."""
