"""paravt: PARA-GRPO training of video language models that call video tools in parallel."""

__version__ = "0.1.0"
