"""The agent: prompts, tool-call parsing, tools, rendering, the rollout loop, greedy runs."""
