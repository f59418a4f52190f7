"""Torch-level model code: loading, tiny Qwen-VL, Qwen-VL inputs, forward passes, step helpers."""
