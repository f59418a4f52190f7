"""The rollout-engine contract shared by the transformers engine and the vLLM engine.

An engine turns batched requests (token ids plus the visual inputs their placeholders stand for)
into sampled continuations with the log-probability of every sampled token. It knows nothing of
tools, rewards or trajectories; the agent loop drives it one round at a time.

Log-probability definition (every engine and the trainer must agree, docs/method.md pitfall 8):
    logp(token) = log_softmax(suppress(logits / temperature))[token]
where `suppress` sets the vision placeholder ids to -inf, no top-k / top-p truncation is applied,
and greedy decoding uses temperature 1 for the reported log-probs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from paravt.types import Visual


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `greedy=True` ignores temperature for the choice of tokens.

    `seed`: the call's base seed (None: unseeded). A request without a seed of its own samples
    with one derived from it and the request's position in the call (`request_seeds`); the
    agent loop gives every request its own (`derive_seed` of this seed, the trajectory's
    position in the step's batch, its turn and its sub-agent call)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    greedy: bool = False
    n: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")

    @property
    def logprob_temperature(self) -> float:
        return 1.0 if self.greedy else self.temperature


@dataclass(frozen=True)
class GenerationRequest:
    """A full context to continue: token ids and the video clips of its placeholders, in order.

    `name` (e.g. "sample-id#g") is how errors about this request name it. `seed`: the seed it
    samples with (vLLM: its own sampler, on whichever server or in whichever batch it lands;
    the transformers engine seeds its one batch generator from all of a call's seeds). None:
    derived from the call's `SamplingParams.seed` and its position in the call (`request_seeds`).
    """

    token_ids: tuple[int, ...]
    visuals: tuple[Visual, ...] = ()
    name: str = ""
    seed: int | None = None


@dataclass(frozen=True)
class GenerationOutput:
    """One sampled continuation. `token_ids` ends with the stop token when finish_reason is stop.
    `version`: the weight version that sampled it, where the engine knows it per call (a rollout
    server reports the version it held); None: the engine's `weight_version` after the call."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # "stop" | "length"
    version: int | None = None


def derive_seed(base: int | None, *path: int) -> int | None:
    """A 63-bit seed for `path` under `base` (None stays None): the first bits of BLAKE2b of the
    integers, so that every process computes the same seed (unlike `hash`) and distinct paths
    get distinct seeds (two of a million coincide with probability ~5e-8)."""
    if base is None:
        return None
    text = ":".join(str(int(x)) for x in (base, *path))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def request_seeds(
    requests: Sequence[GenerationRequest], params: SamplingParams
) -> list[int | None]:
    """The seed each request samples with: its own, else `params.seed` combined with its
    position in the call (so the G copies of a prompt in one call differ)."""
    return [
        r.seed if r.seed is not None else derive_seed(params.seed, i)
        for i, r in enumerate(requests)
    ]


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that can continue batched multimodal contexts."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        """Per request, `params.n` outputs; request i samples with `request_seeds(...)[i]`
        (an engine with one random generator per batch seeds it from all of them)."""
        ...

    def sync_weights(self, policy: Any, version: int) -> None:
        """Receive `policy`'s weights (a torch module) after optimiser step `version`."""
        ...

    @property
    def weight_version(self) -> int:
        """The optimiser step whose weights the engine currently samples with."""
        ...


# What `rollout.engine.dtype` may name: "auto" (the policy's load dtype) or a torch / vLLM name.
ENGINE_DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float", "float64")


@dataclass(frozen=True)
class EngineConfig:
    """Which engine and its options. The vLLM fields are ignored by the transformers engine.

    `name` is checked against the engines the factory knows (`paravt.rollout.factory.ENGINES`)
    by `check_engine_name`, where the engines are registered.

    GPU-only (ignored on CPU): `gpu_memory_utilization`, `tensor_parallel_size`,
    `enable_sleep_mode` (colocated training: the engine sleeps during the update and frees its
    KV cache). `kv_cache_gb` sizes the CPU backend's KV cache (VLLM_CPU_KVCACHE_SPACE).
    `mm_processor_cache_gb` caps vLLM's LRU cache of processed videos (it serves the G rollouts
    of a group and the later rounds of a trajectory, which resend the same clips); host memory
    holds up to that much per engine, so lower it when RAM is short.
    """

    name: str = "hf"
    # "auto": the dtype the model was loaded at (`model.dtype`; not FSDP2's fp32 master weights)
    dtype: str = "auto"
    max_model_len: int = 8192
    max_num_seqs: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False
    kv_cache_gb: int = 1
    mm_processor_cache_gb: float = 4.0  # vLLM's default
    max_videos_per_prompt: int = 16  # overview + crops of one context
    sync_bucket_mb: int = 256
    seed: int = 0
    # vllm_server only (paravt.rollout.serving.client): running servers' URLs, or none to start
    # `num_servers` with `server_python` ("auto": this interpreter if it has vLLM, else
    # .venv-vllm's) on the GPUs `devices` (num_servers x tensor_parallel_size of them, none of
    # the trainer's; numbered as the trainer sees them, i.e. within its CUDA_VISIBLE_DEVICES;
    # empty: inherit); `sync_dir`: where full checkpoints go ("": /dev/shm).
    server_urls: tuple[str, ...] = ()
    num_servers: int = 1
    devices: tuple[int, ...] = ()
    server_python: str = "auto"
    sync_dir: str = ""
    server_log_dir: str = ""
    server_start_timeout_s: float = 900.0
    server_request_timeout_s: float = 3600.0
    # vllm_server only: how the weights reach the servers (paravt.rollout.serving.nccl):
    # "checkpoint" (a full checkpoint in `sync_dir`, any device) or "nccl" (vLLM's NCCL weight
    # transfer from the trainer's rank 0, GPUs only); the address and port the servers reach
    # rank 0 at ("": loopback for servers on this machine, else this host's; 0: a free port).
    weight_transfer: str = "checkpoint"
    weight_transfer_address: str = ""
    weight_transfer_port: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "server_urls", tuple(self.server_urls or ()))
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices or ()))
        need = self.num_servers * self.tensor_parallel_size
        if self.devices and not self.server_urls and len(self.devices) != need:
            raise ValueError(
                f"rollout.engine.devices={list(self.devices)} names {len(self.devices)} GPU(s) "
                f"for num_servers={self.num_servers} x tensor_parallel_size="
                f"{self.tensor_parallel_size}: give {need} ids or none"
            )
        if self.num_servers < 1 and not self.server_urls:
            raise ValueError(f"num_servers must be >= 1, got {self.num_servers}")
        if self.mm_processor_cache_gb < 0:
            raise ValueError(
                f"mm_processor_cache_gb must be >= 0, got {self.mm_processor_cache_gb}"
            )
        if self.sync_bucket_mb < 1:
            raise ValueError(f"sync_bucket_mb must be >= 1, got {self.sync_bucket_mb}")
        if self.dtype not in ENGINE_DTYPES:
            raise ValueError(
                f"rollout.engine.dtype={self.dtype!r}: choose one of {', '.join(ENGINE_DTYPES)}"
            )
        if self.weight_transfer not in ("checkpoint", "nccl"):
            raise ValueError(
                f"weight_transfer must be 'checkpoint' (a full checkpoint on shared disk or "
                f"tmpfs) or 'nccl' (vLLM's NCCL weight transfer, GPUs only), got "
                f"{self.weight_transfer!r}"
            )

    def server_gpus(self, i: int) -> tuple[int, ...] | None:
        """The GPUs of started server `i`, as the trainer's process counts them (`cuda:k`; the
        server's CUDA_VISIBLE_DEVICES maps them through the trainer's own,
        `paravt.rollout.serving.launch.server_env`): its tensor_parallel_size ids of `devices` in
        order; None (inherit) when `devices` is empty."""
        if not self.devices:
            return None
        tp = self.tensor_parallel_size
        return self.devices[i * tp : (i + 1) * tp]
