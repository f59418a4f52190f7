"""The agent: prompts, tool-call parsing, tools and the rollout loop."""
