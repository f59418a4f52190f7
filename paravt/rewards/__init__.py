"""PARA-GRPO rewards: accuracy, format, tool use, their composition, and the structural anchor."""
