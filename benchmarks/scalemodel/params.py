"""Every parameter of the timing model, its default and where the default comes from.

Each field becomes a command-line option of `benchmarks/scale_model.py` (`--decode-base-s
0.01`); `--help` prints the sources. Defaults describe Qwen3-VL-8B (bf16) on H100 80 GB GPUs
with vLLM for generation and FSDP2 for the update, and the paper's step shape. "arithmetic"
marks a figure derived from a published size and a peak rate, not measured anywhere.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace


def _p(default, source: str):
    return field(default=default, metadata={"source": source})


@dataclass(frozen=True)
class Params:
    # ---- the step shape (ParaVT reference recipe, paravt/rl/configs/_base.yaml) ----
    prompts: int = _p(7, "prompts a step: reference train_dataset.batch_size 7")
    group: int = _p(8, "rollouts a prompt G: reference gconfig.n_samples 8")
    overview_frames: int = _p(64, "overview frames: reference hierarchical_agent.nframes 64")
    crop_frames: int = _p(16, "frames a crop: crop_video's cap at 1 fps (docs/method.md)")
    tokens_per_frame: float = _p(
        24.5, "LM tokens a 224 px frame: 7 x 7 merged patches per 2-frame block (Qwen3-VL)"
    )
    prompt_text_tokens: int = _p(600, "system prompt with the tool schema + question (assumed)")
    response_text_tokens: int = _p(40, "text around one tool response (assumed)")
    max_rounds: int = _p(3, "tool rounds: reference hierarchical_agent.max_turns 3")
    max_new_tokens: int = _p(2048, "tokens a turn at most: reference gconfig.max_new_tokens")
    # ---- the long tail (state these before reading any result) ----
    round_probs: str = _p(
        "0.30,0.35,0.20,0.15",
        "P(0..3 tool rounds) a trajectory; with call_probs the mean is 2.46 calls a rollout, "
        "the paper's kappa 2.50 after the cold-start SFT (docs/method.md); shape assumed",
    )
    call_probs: str = _p(
        "0.40,0.30,0.15,0.10,0.05", "P(1..5 parallel crops) a tool round (assumed; mean 2.05)"
    )
    turn_tokens_median: float = _p(
        350.0, "median tokens a turn (think + calls or answer): lognormal, fitted (see docs)"
    )
    turn_tokens_sigma: float = _p(
        1.0, "lognormal sigma of tokens a turn (assumed); capped at max_new_tokens"
    )
    # ---- the engine: vLLM, one GPU, Qwen3-VL-8B bf16 ----
    max_num_seqs: int = _p(64, "sequences a server runs at once: reference max_concurrent 64")
    decode_base_s: float = _p(
        0.008,
        "s a decode iteration, weights only: 16.4 GB bf16 over H100 HBM3 3.35 TB/s at ~60% "
        "(arithmetic); batch 8 costs 7% more than batch 1 in gpustack's vLLM Qwen3-8B H100 "
        "latency benchmark (1.78 vs 1.66 s a request)",
    )
    kv_bytes_per_token: int = _p(
        147456, "KV cache bytes a token: 36 layers x 8 KV heads x 128 x 2 x bf16 (Qwen3-8B)"
    )
    hbm_gbps: float = _p(2000.0, "GB/s the decode reads the KV cache at (60% of 3,350)")
    kv_capacity_tokens: int = _p(
        350_000, "KV tokens a server holds: (80 GB x 0.9 - 16.4 GB - 4 GB) / 147,456 B"
    )
    prefill_tokens_per_s: float = _p(
        30_000.0, "prefill: 2 x 8.2e9 FLOP a token at 50% of 989 TFLOP/s (arithmetic)"
    )
    vision_s_per_frame: float = _p(
        0.0003, "vision tower: ~0.6e9 params x 98 patches a frame x 2 FLOP at 40% (arithmetic)"
    )
    # ---- tools (CPU) ----
    crop_s_per_frame: float = _p(0.05, "decord seek + decode of one crop frame (assumed)")
    cpu_cores: int = _p(100, "CPU cores a node gives the crop executor (assumed)")
    # ---- the trainer: FSDP2 ----
    train_tokens_per_s: float = _p(
        7500.0, "tokens/s/GPU fwd+bwd, 7B, H100, no checkpointing: fms-fsdp's published table"
    )
    rl_pass_factor: float = _p(
        2.0,
        "RL update cost / fwd+bwd: + checkpoint recompute, proximal and reference forwards "
        "(6 passes against 3)",
    )
    update_fixed_s: float = _p(1.0, "s an update besides tokens: optimizer, collectives (assumed)")
    # ---- weight sync ----
    weights_gb: float = _p(16.4, "bf16 weights: 8.2e9 params x 2 B")
    colocated_sync_gbps: float = _p(
        50.0, "GB/s of the in-process reload after sleep (NVLink gather + copy; assumed)"
    )
    server_sync_gbps: float = _p(
        3.0, "GB/s of a server sync through a checkpoint folder (docs/results.md: 2-5 GB/s)"
    )
    # ---- the run ----
    steps: int = _p(24, "steps simulated a row")
    warmup: int = _p(3, "first steps left out of every figure")
    seed: int = _p(0, "seed of the drawn trajectories (every mode draws the same ones)")

    @property
    def kv_s_per_token(self) -> float:
        """Decode seconds an iteration spends per context token of the running sequences."""
        return self.kv_bytes_per_token / (self.hbm_gbps * 1e9)

    @property
    def update_s_per_token(self) -> float:
        """One GPU's update seconds per trained token."""
        return self.rl_pass_factor / self.train_tokens_per_s


def probs(text: str) -> list[float]:
    """A comma-separated list of probabilities, checked to sum to 1."""
    values = [float(v) for v in text.split(",")]
    if any(v < 0 for v in values) or abs(sum(values) - 1) > 1e-6:
        raise ValueError(f"probabilities must be >= 0 and sum to 1, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One `--name` option per parameter, its source as the help."""
    for f in fields(Params):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(f.default),
            default=None,
            help=f"{f.metadata['source']} (default {f.default})".replace("%", "%%"),
        )


def from_args(args: argparse.Namespace, base: Params = Params()) -> Params:
    """`base` with every option given on the command line."""
    given = {f.name: getattr(args, f.name) for f in fields(Params)}
    return replace(base, **{k: v for k, v in given.items() if v is not None})


def sources() -> list[str]:
    """'name = default: source' for every parameter, for the printed report."""
    return [f"{f.name} = {f.default}: {f.metadata['source']}" for f in fields(Params)]
