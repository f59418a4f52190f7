"""The PARA-GRPO objective's tensor core: advantages, losses, KL, log-probs, budgets, metrics."""
