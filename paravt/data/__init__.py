"""Data: row schemas (pure), file loading, SFT encoding and packing, the PromptDataModule."""
