"""A per-GPU memory plan of a training config, from the model's published sizes (no GPU needed).

Like DeepSpeed's `estimate_zero3_model_states_mem_needs`, but for paravt's whole step: FSDP2
shards of the fp32 master weights, gradients and AdamW moments over W = devices x num_nodes
ranks, the frozen reference, each rank's unsharded rollout engine with its KV cache, and the
training activations of one micro-batch with and without activation checkpointing. The step has
two phases that do not overlap in time: rollout (engine KV cache) then update (activations);
the peak is the resident state plus the larger phase. With the rollouts on generation servers
(`rollout/engine=vllm_server`) the trainer's GPUs hold no engine, and each server GPU gets a plan
of its own (`server_plan`: its weights and the KV cache vLLM reserves). Estimates from formulas,
not measurements: the status table of `docs/development.md`
says which figures a GPU run has confirmed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
MIB = 1024**2
HEAD_CHUNK = 1024  # tokens per lm_head chunk (trajectory_logprobs' chunk_size)

# Memory outside PyTorch's tensors, per process and GPU (estimates; no GPU has measured them):
# - the CUDA context with the kernel modules torch, vLLM and NCCL load: PyTorch's lazy module
#   loading (pytorch/pytorch#86509) measured 0.27 GiB for torch alone (0.62 GiB eager); 1 GiB
#   leaves room for vLLM's and NCCL's modules in the same process.
CUDA_CONTEXT = 1 * GIB
# - cuBLAS and cuBLASLt workspaces: 32 MiB each per (handle, stream) on Hopper
#   (pytorch/pytorch#120925, the cuBLAS guide's recommendation); four streams that run matmuls
#   (the training stream, vLLM's, the engine's sync and a side stream) x two libraries.
CUBLAS_WORKSPACES = 4 * 2 * 32 * MIB
# - one NCCL communicator of 8 ranks on NVLink: receive buffers of NCCL_BUFFSIZE (4 MiB, the
#   Simple protocol) plus LL128 (~4.5 MiB) and LL (~0.25 MiB) per channel and ring peer, up to
#   32 channels and 2 peers (NCCL's environment-variable docs): ~600 MiB; 768 MiB with NVLS.
NCCL_COMMUNICATOR = 768 * MIB


@dataclass(frozen=True)
class ModelSize:
    """The sizes of a Qwen-VL checkpoint that set its memory (language model + vision tower)."""

    name: str
    total_params: int  # everything, vision tower included
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def layer_params(self) -> int:
        """One decoder layer: q, o (hidden x hidden), k, v (hidden x kv), the SwiGLU MLP."""
        kv = self.kv_heads * self.head_dim
        return (
            2 * self.hidden * self.hidden
            + 2 * self.hidden * kv
            + 3 * self.hidden * self.intermediate
        )

    @property
    def lm_params(self) -> int:
        """The language model: decoder layers, input embedding and (untied) output head."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden

    @property
    def vision_params(self) -> int:
        return max(self.total_params - self.lm_params, 0)

    @property
    def root_params(self) -> int:
        """FSDP2's root unit (paravt.parallel.fsdp): embeddings, lm_head and the vision tower
        (the final norm's 4096 weights left out)."""
        return 2 * self.vocab * self.hidden + self.vision_params

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer in bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


# Bytes per element and the plan's short name of each engine dtype (`rollout.engine.dtype`).
DTYPES = {
    "bfloat16": (2, "bf16"),
    "float16": (2, "fp16"),
    "half": (2, "fp16"),
    "float32": (4, "fp32"),
    "float": (4, "fp32"),
    "float64": (8, "fp64"),
}


# Published sizes (the models' config.json; parameter totals of their model cards:
# Qwen3-VL-8B 8.77B, Qwen2.5-VL-7B 8.29B). The vision tower is the difference.
PUBLISHED = {
    "qwen3_vl_8b": ModelSize("Qwen3-VL-8B", 8_770_000_000, 36, 4096, 12288, 8, 128, 151936),
    "qwen2_5_vl_7b": ModelSize("Qwen2.5-VL-7B", 8_290_000_000, 28, 3584, 18944, 4, 128, 152064),
}
_NAMES = {"qwen3-vl-8b": "qwen3_vl_8b", "qwen2.5-vl-7b": "qwen2_5_vl_7b"}


def checkpoint_params(path: Path) -> int:
    """Elements of every tensor in the checkpoint's safetensors files, read from their headers
    (8-byte length, then JSON with each tensor's shape): no weight is loaded."""
    import math
    import struct

    total = 0
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def from_config_json(path: Path) -> ModelSize:
    """Sizes of a local checkpoint (e.g. a tiny model) from its config.json, and its parameter
    total (vision tower and norms included) from its weights' headers when they are there."""
    cfg = json.loads((path / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    heads = text["num_attention_heads"]
    size = ModelSize(
        name=path.name,
        total_params=0,
        layers=text["num_hidden_layers"],
        hidden=text["hidden_size"],
        intermediate=text["intermediate_size"],
        kv_heads=text.get("num_key_value_heads", heads),
        head_dim=text.get("head_dim") or text["hidden_size"] // heads,
        vocab=text["vocab_size"],
    )
    from dataclasses import replace

    return replace(size, total_params=checkpoint_params(path) or size.lm_params)


def model_size(model_cfg) -> ModelSize | None:
    """The sizes of `model.path`: a published Qwen-VL named in the path, else the local
    checkpoint's config.json, else None (the plan then says what to pass)."""
    path = str(model_cfg.get("path") or "")
    low = path.lower()
    for key, name in _NAMES.items():
        if key in low:
            return PUBLISHED[name]
    if (Path(path) / "config.json").exists():
        return from_config_json(Path(path))
    return None


@dataclass(frozen=True)
class PlanInputs:
    """What of the config the plan reads (`plan_inputs` builds it from the composed config)."""

    world: int
    prompts_per_rank: int
    group_size: int
    max_total_tokens: int
    micro_batch_tokens: int
    kl: bool
    freeze_vision: bool
    adam_bytes: int  # bytes of optimiser state per trainable parameter (AdamW fp32: 8)
    engine: str  # "hf" | "vllm" | "vllm_server" (generation apart: no engine on these GPUs)
    vllm_share: float  # gpu_memory_utilization
    sleep_mode: bool
    checkpointing: bool
    gpu_gb: float
    engine_dtype: str = "bfloat16"  # the engine's weights and KV cache (rollout.engine.dtype)
    feature_cache_bytes: int = 0  # bound of one model's vision feature cache (rollout.vision_cache)
    # rank 0's async generator process (`generator_items`): "" none (sync), "host", "nccl", "copy"
    generator: str = ""
    sync_bucket_bytes: int = 256 * MIB  # rollout.engine.sync_bucket_mb


GENERATORS = ("", "host", "nccl", "copy")


def generator_items(size: ModelSize, x: PlanInputs) -> dict[str, float]:
    """What rank 0's asynchronous generator process (`paravt.generator.worker`) holds on rank
    0's GPU, through both phases (it runs beside the update):
    - "host": rollout servers synced by checkpoint. Its policy is a skeleton over the shared
      host copy (`SharedWeights.attach`) and nothing in it touches CUDA: nothing.
    - "nccl": rollout servers synced over NCCL, sent from that host copy a bucket at a time:
      its CUDA context, one bucket on the GPU (a bucket closes once it reaches the bound, so
      it holds less than the bound plus the largest tensor, an embedding matrix) and the
      transfer group's communicator.
    - "copy": an engine of its own in the process, built on a policy copy at the engine
      dtype: with its CUDA context, and the KV cache of the whole batch (the generator samples
      every rank's prompts) at full length for the transformers engine, or the in-process
      vLLM engine's share of the GPU (which check-recipe refuses on GPUs: issue 50, 3)."""
    if x.generator not in GENERATORS:
        raise ValueError(f"generator {x.generator!r}: one of {GENERATORS}")
    nbytes = DTYPES[x.engine_dtype][0]
    if x.generator == "nccl":
        return {
            "rank 0: generator CUDA context": CUDA_CONTEXT,
            "rank 0: generator sync bucket on the GPU": x.sync_bucket_bytes
            + nbytes * size.vocab * size.hidden,
            "rank 0: generator NCCL communicator (weights)": NCCL_COMMUNICATOR,
        }
    if x.generator != "copy":
        return {}
    out = {
        "rank 0: generator policy copy": nbytes * size.total_params,
        "rank 0: generator CUDA context": CUDA_CONTEXT,
    }
    if x.engine == "vllm":
        return out | {"rank 0: generator vLLM engine (its share)": x.vllm_share * x.gpu_gb * 1e9}
    batch = x.prompts_per_rank * x.world * x.group_size
    kv_token = size.kv_bytes_per_token // 2 * nbytes
    return out | {"rank 0: generator KV cache (whole batch)": batch * x.max_total_tokens * kv_token}


def _engine_items(size: ModelSize, x: PlanInputs) -> tuple[dict[str, float], float, float]:
    """The rollout engine's resident bytes on a trainer GPU, the KV cache its rollout phase
    adds on top, and the KV cache all of a rank's rollouts need at full length."""
    if x.engine == "vllm_server":  # on the servers' own GPUs (`server_plan`)
        return {}, 0.0, 0.0
    p = size.total_params
    nbytes, short = DTYPES[x.engine_dtype]
    kv_token = size.kv_bytes_per_token // 2 * nbytes
    kv_need = x.prompts_per_rank * x.group_size * x.max_total_tokens * kv_token
    weights_key = f"engine weights {short} (" + ("vLLM, " if x.engine == "vllm" else "own ")
    items = {weights_key + "full copy)": nbytes * p}  # every parameter, vision tower included
    if x.engine != "vllm":
        return items, kv_need, kv_need
    # gpu_memory_utilization caps weights + KV cache together
    items["engine KV cache (vLLM reservation)"] = max(x.vllm_share * x.gpu_gb * 1e9 - nbytes * p, 0)
    return items, 0.0, kv_need


def _overheads(x: PlanInputs) -> dict[str, float]:
    """Resident bytes besides the model state: the vision feature caches of the policy and,
    with a KL term, the reference (each up to its bound, kept on the GPU across the step), and
    the memory outside PyTorch's tensors (the constants above). The communicators: Lightning's
    default group and the FSDP mesh's data-parallel group, plus vLLM's world group when each
    rank runs its own engine; a single rank has none."""
    comms = 0 if x.world == 1 else (3 if x.engine == "vllm" else 2)
    caches = (2 if x.kl else 1) * x.feature_cache_bytes
    return {
        "vision feature caches (policy + reference)" if x.kl else "vision feature cache": caches,
        "CUDA context and kernel modules": CUDA_CONTEXT,
        "cuBLAS/cuBLASLt workspaces": CUBLAS_WORKSPACES,
        f"NCCL communicators ({comms} x {NCCL_COMMUNICATOR // MIB} MiB)": comms * NCCL_COMMUNICATOR,
    }


def plan(size: ModelSize, x: PlanInputs) -> dict[str, float]:
    """Bytes per GPU of each item, the phases, the peak and the headroom (keys as printed)."""
    w, p = x.world, size.total_params
    trainable = size.lm_params if x.freeze_vision else p
    t = max(x.micro_batch_tokens, x.max_total_tokens)  # one trajectory never splits
    layer_acts = (
        t * (6 * size.hidden + 2 * size.kv_heads * size.head_dim + 4 * size.intermediate) * 2
    )
    out = {
        "policy fp32 master (sharded)": 4 * p / w,
        "gradients fp32 (sharded, trainable)": 4 * trainable / w,
        "AdamW moments (sharded)": x.adam_bytes * trainable / w,
        "reference bf16 (sharded)": 2 * p / w if x.kl else 0.0,
        "gathered bf16 layers (2 in flight)": 2 * 2 * size.layer_params,
    } | _overheads(x)
    engine, kv_phase, kv_need = _engine_items(size, x)
    out |= engine | generator_items(size, x)
    # The chunked lm_head (paravt/rl/fused_logprobs.py) never holds [t, V] logits: its working
    # set is about three [chunk, V] fp32 buffers (docs/results.md, measured on CPU).
    logits = 3 * min(t, HEAD_CHUNK) * size.vocab * 4
    act_ckpt = size.layers * t * size.hidden * 2 + layer_acts + logits
    act_full = size.layers * layer_acts + logits
    resident = sum(out.values())
    asleep = x.engine == "vllm" and x.sleep_mode  # weights + KV released during the update
    resident_update = resident - sum(engine.values()) if asleep else resident
    acts = act_ckpt if x.checkpointing else act_full
    if x.engine != "vllm_server":
        out["rollout: KV cache needed at max_total_tokens"] = kv_need
    # The root unit is not resharded after its forward (FSDP2 keeps the root gathered for the
    # backward that follows), and lm_head's gradient, the first the backward makes, stays
    # unsharded bf16 until the root's reduce-scatter at the end of the backward.
    update = {
        "update: root unit bf16 (embed, lm_head, vision)": 2 * size.root_params,
        "update: lm_head gradient bf16 (unsharded)": 2 * size.vocab * size.hidden,
        "update: activations, checkpointing": act_ckpt,
        "update: activations, no checkpointing": act_full,
    }
    out |= update
    out["peak rollout phase"] = resident + kv_phase
    out["peak update phase"] = resident_update + acts + sum(list(update.values())[:2])
    out["peak"] = max(out["peak rollout phase"], out["peak update phase"])
    out["gpu"] = x.gpu_gb * 1e9
    out["headroom"] = out["gpu"] - out["peak"]
    return out


def format_plan(size: ModelSize, x: PlanInputs, numbers: dict[str, float]) -> str:
    """The plan as the table `paravt check-recipe` prints (GiB per GPU)."""
    lines = [
        f"memory plan per GPU: {size.name} ({size.total_params / 1e9:.2f}B parameters, "
        f"{size.lm_params / 1e9:.2f}B language model), W = {x.world} ranks, "
        f"{x.prompts_per_rank} prompt(s) x {x.group_size} rollouts per rank, "
        f"{x.max_total_tokens} tokens per trajectory, engine {x.engine} "
        f"({DTYPES[x.engine_dtype][1]})",
    ]
    for key, value in numbers.items():
        if key in ("gpu", "headroom"):
            continue
        lines.append(f"  {key:<48} {value / GIB:8.1f} GiB")
    reserved = numbers.get("engine KV cache (vLLM reservation)")
    need = numbers.get("rollout: KV cache needed at max_total_tokens", 0.0)
    if reserved is not None and reserved < need:
        lines.append(
            f"  note: vLLM's KV reservation ({reserved / GIB:.1f} GiB) is below what all of a "
            f"rank's rollouts need at full length ({need / GIB:.1f} GiB): it runs fewer at a "
            "time (raise rollout.engine.gpu_memory_utilization if the plan leaves room)"
        )
    if x.generator == "host":
        lines.append(
            "  rank 0's async generator holds nothing on a GPU: its policy is the shared host "
            "copy, which each checkpoint sync reads in place"
        )
    used = "with" if x.checkpointing else "without"
    lines.append(
        f"  peak ({used} activation checkpointing) {numbers['peak'] / GIB:.1f} GiB of "
        f"{numbers['gpu'] / GIB:.1f} GiB ({x.gpu_gb:g} GB GPU); estimates, not measurements"
    )
    lines.append(f"  headroom {numbers['headroom'] / GIB:.1f} GiB per GPU")
    return "\n".join(lines)


@dataclass(frozen=True)
class ServerInputs:
    """What of the config one generation server's plan reads (`rollout/engine=vllm_server`)."""

    tensor_parallel: int  # GPUs of one server (rollout.engine.tensor_parallel_size)
    gpu_share: float  # gpu_memory_utilization: vLLM's cap on its weights + KV cache together
    max_num_seqs: int  # sequences the server runs at once
    max_model_len: int  # tokens of one trajectory, prompt and every turn
    gpu_gb: float
    dtype: str = "bfloat16"


SERVER_KV = "server KV cache (vLLM reservation)"


def server_plan(size: ModelSize, s: ServerInputs) -> dict[str, float]:
    """Bytes per GPU of one generation server: its share of the weights (tensor parallelism
    splits layers, embeddings and KV heads), the KV cache vLLM reserves in what
    `gpu_memory_utilization` leaves, and the KV cache of one and of `max_num_seqs`
    full-length trajectories. vLLM's own profiling (activations of its largest batch, the
    vision encoder's) comes out of the reservation, so it is an upper bound."""
    nbytes, short = DTYPES[s.dtype]
    tp = s.tensor_parallel
    weights = nbytes * size.total_params / tp
    cap = s.gpu_share * s.gpu_gb * 1e9
    one = s.max_model_len * size.kv_bytes_per_token // 2 * nbytes / tp
    return {
        f"server weights {short} (1/{tp} of the model)": weights,
        SERVER_KV: max(cap - weights, 0.0),
        "KV cache of one trajectory at max_model_len": one,
        f"KV cache of max_num_seqs={s.max_num_seqs} at max_model_len": s.max_num_seqs * one,
        "peak (gpu_memory_utilization x GPU)": cap,
        "gpu": s.gpu_gb * 1e9,
    }


def format_server_plan(size: ModelSize, s: ServerInputs, numbers: dict[str, float]) -> str:
    """One server GPU's plan as `paravt check-recipe` prints it (GiB)."""
    lines = [
        f"memory plan per generation-server GPU: {size.name}, {s.tensor_parallel} GPU(s) a "
        f"server, up to {s.max_num_seqs} sequences at once, {s.max_model_len} tokens each "
        f"({DTYPES[s.dtype][1]})"
    ]
    lines += [
        f"  {key:<48} {value / GIB:8.1f} GiB" for key, value in numbers.items() if key != "gpu"
    ]
    one = numbers["KV cache of one trajectory at max_model_len"]
    fits = int(numbers[SERVER_KV] // one) if one else 0
    if fits < s.max_num_seqs:
        lines.append(
            f"  note: the reservation holds {fits} full-length trajectories at once; shorter "
            f"ones share it up to max_num_seqs={s.max_num_seqs}, the rest wait in vLLM's queue"
        )
    lines.append(
        f"  peak {numbers['peak (gpu_memory_utilization x GPU)'] / GIB:.1f} GiB of "
        f"{numbers['gpu'] / GIB:.1f} GiB ({s.gpu_gb:g} GB GPU); estimates, not measurements"
    )
    return "\n".join(lines)
