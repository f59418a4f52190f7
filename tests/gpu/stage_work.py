"""The work of each GPU-script stage (tests/gpu/stages.py runs one per subprocess).

Each function takes the parsed options and returns a JSON-able dict. The model stages build the
real Qwen3-VL-8B configuration (`qwen3_vl_8b_config`) with random weights, truncated to a few
decoder layers, so no checkpoint and no network are needed; `--tiny` swaps in a small config of
the same architecture so that the CPU tests (tests/gpu/test_stages.py) run the same code.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
# Qwen's special ids (public, fixed from 151643; the tokenizer is not needed for these stages).
QWEN_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
# Published Qwen/Qwen3-VL-8B-Instruct config.json (text and vision towers). transformers'
# Qwen3VLConfig() defaults are NOT this model (intermediate 22016, 32 layers, 32 KV heads,
# vision out_hidden_size 3584), hence spelled out.
QWEN3_VL_8B_TEXT = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 5000000.0,
        "mrope_interleaved": True,
        "mrope_section": [24, 20, 20],
    },
)
QWEN3_VL_8B_VISION = dict(
    depth=27,
    hidden_size=1152,
    intermediate_size=4304,
    num_heads=16,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=4096,
    num_position_embeddings=2304,
    deepstack_visual_indexes=[8, 16, 24],
)
TINY_TEXT = dict(
    QWEN3_VL_8B_TEXT,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_parameters=dict(QWEN3_VL_8B_TEXT["rope_parameters"], mrope_section=[4, 2, 2]),
)
TINY_VISION = dict(
    QWEN3_VL_8B_VISION,
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    out_hidden_size=64,
    deepstack_visual_indexes=[0],
)


class QwenSpecialIds:
    """What TransformersEngine reads from a tokenizer, at Qwen's real ids."""

    pad_token_id = QWEN_IDS["<|endoftext|>"]
    unk_token_id = None

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return QWEN_IDS.get(token)


def qwen3_vl_8b_config(layers: int, tiny: bool):
    from transformers import Qwen3VLConfig

    text = dict(TINY_TEXT if tiny else QWEN3_VL_8B_TEXT, num_hidden_layers=layers)
    vision = TINY_VISION if tiny else QWEN3_VL_8B_VISION
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=QWEN_IDS["<|image_pad|>"],
        video_token_id=QWEN_IDS["<|video_pad|>"],
        vision_start_token_id=QWEN_IDS["<|vision_start|>"],
        vision_end_token_id=QWEN_IDS["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def build_model(layers: int, device: str, tiny: bool):
    from transformers import Qwen3VLForConditionalGeneration

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration._from_config(
            qwen3_vl_8b_config(layers, tiny), dtype=dtype, attn_implementation="sdpa"
        )
    return model


def clip_inputs(frames: int, side: int, tokens: int, device: str, tiny: bool):
    """input_ids [1, tokens] holding a `frames`-frame clip of side x side pixels the way Qwen3-VL's
    processor lays it out (one vision_start / video_pad* / vision_end block per temporal patch),
    with its pixel_values_videos / video_grid_thw (random pixels: memory and time do not care)."""
    cfg = TINY_VISION if tiny else QWEN3_VL_8B_VISION
    patch, merge, tp = cfg["patch_size"], cfg["spatial_merge_size"], cfg["temporal_patch_size"]
    grid = (frames // tp, side // patch, side // patch)
    per_block = grid[1] * grid[2] // merge**2
    block = [QWEN_IDS["<|vision_start|>"]] + [QWEN_IDS["<|video_pad|>"]] * per_block
    block = [*block, QWEN_IDS["<|vision_end|>"]] * grid[0]
    if len(block) + 8 > tokens:
        raise ValueError(f"{tokens} tokens cannot hold a {frames}-frame clip of {len(block)}")
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 151000, (tokens - len(block),), generator=g)
    ids = torch.cat([text[:4], torch.tensor(block), text[4:]]).unsqueeze(0)
    pixels = torch.randn(grid[0] * grid[1] * grid[2], 3 * tp * patch * patch)
    return ids.to(device), pixels.to(device), torch.tensor([grid]).to(device), per_block * grid[0]


def nccl(opts) -> dict:
    """Single-rank collectives on the device the backend requires (NCCL: CUDA tensors)."""
    import torch.distributed as dist

    backend = "nccl" if opts.device == "cuda" else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group(backend, rank=0, world_size=1)
    results = {}
    try:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.arange(8, dtype=dtype, device=opts.device)
            dist.all_reduce(x)
            gathered = [torch.empty_like(x)]
            dist.all_gather(gathered, x)
            out = torch.empty_like(x)
            dist.reduce_scatter_tensor(out, x)
            dist.broadcast(x, 0)
            ok = torch.equal(gathered[0], x) and torch.equal(out, x)
            results[str(dtype).removeprefix("torch.")] = bool(ok)
    finally:
        dist.destroy_process_group()
    return {"backend": backend, "ok": all(results.values()), **results}


def _peak_reset(device: str) -> None:
    """Start a new peak from what is live now. Lightning's trainer holds a fitted module in
    reference cycles, so the previous row's model outlives its `del` until a collection (28-35
    GB left in the next row's peak on a GPU): collect first."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _allocated_gib(device: str) -> float:
    return torch.cuda.memory_allocated() / 2**30 if device == "cuda" else 0.0


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def _sizes(opts) -> tuple[list[int], int, int]:
    """(token lengths, frames, frame side) of the model stages."""
    if opts.tiny:
        return [256], 8, 32
    return [4096, 16384], 64, 224


PLAN_MARGIN = 1.25  # the step stage passes when its peak is at most 1.25 x the plan's
TRAINER_TERMS = (  # the memory plan's items of a trainer with no engine and no reference
    "policy fp32 master (sharded)",
    "gradients fp32 (sharded, trainable)",
    "AdamW moments (sharded)",
    "gathered bf16 layers (2 in flight)",
    "update: activations, checkpointing",
)


def plan_update_gib(model, tokens: int, tiny: bool) -> float:
    """What `paravt check-recipe`'s memory plan (paravt.run.memory_plan) gives for the update
    phase of `model` (its layers, all of its parameters) on one rank, one `tokens`-token
    micro-batch: fp32 master weights, fp32 gradients and AdamW moments of the language model
    (vision frozen), the gathered bf16 layers and the checkpointed activations (no engine, no
    reference: the stage builds neither)."""
    from paravt.run.memory_plan import GIB, ModelSize, PlanInputs, plan

    text = TINY_TEXT if tiny else QWEN3_VL_8B_TEXT
    size = ModelSize(
        name="step stage",
        total_params=sum(p.numel() for p in model.parameters()),
        layers=model.config.text_config.num_hidden_layers,
        hidden=text["hidden_size"],
        intermediate=text["intermediate_size"],
        kv_heads=text["num_key_value_heads"],
        head_dim=text["head_dim"],
        vocab=text["vocab_size"],
    )
    inputs = PlanInputs(
        world=1,
        prompts_per_rank=1,
        group_size=2,
        max_total_tokens=tokens,
        micro_batch_tokens=tokens,
        kl=False,
        freeze_vision=True,
        adam_bytes=8,
        engine="hf",
        vllm_share=0.0,
        sleep_mode=False,
        checkpointing=True,
        gpu_gb=141.0,
    )
    numbers = plan(size, inputs)
    return sum(numbers[k] for k in TRAINER_TERMS) / GIB


def processor_dir(out: Path) -> Path:
    """A checkpoint folder with Qwen's real vocabulary and processor (tiny weights): what
    GRPOModule loads its processor and token ids from; the stages swap in their own policy."""
    from paravt.models.tiny import TinyModelConfig, build_tiny_model, tiny_config_matches

    path, cfg = out / "qwen_vocab_model", TinyModelConfig(tokenizer="qwen")
    return path if tiny_config_matches(path, cfg) else build_tiny_model(path, cfg)


def _rollout_batch(ids, pixels, grid):
    """One prompt, two rollouts of the clip's `ids`, the second half trained, with behaviour
    log-probs near the policy's (random weights: about -log V)."""
    from paravt.rollout.records import RolloutBatch
    from paravt.types import Sample, Trajectory, Visual

    tokens = tuple(ids[0].tolist())
    half = len(tokens) // 2
    mask = (0,) * half + (1,) * (len(tokens) - half)
    logp = tuple(-12.0 * m for m in mask)
    visual = Visual(pixels.cpu(), grid.cpu())
    trajs = tuple(
        Trajectory("s0", g, tokens, mask, logp, (visual,), prompt_length=half) for g in (0, 1)
    )
    sample = Sample(id="s0", video="none.mp4", question="q", answer="A")
    return RolloutBatch(0, 0, (sample,), (4,), trajs, 2, 1.0, 0, durations=(60.0,))


def _grpo_module(path: Path, model, tokens: int):
    """The recipe's GRPOModule (torch AdamW at lr 2e-6, gradient checkpointing, the structural
    anchor, no KL) around
    `model`; its two rollouts get rewards 1 and 0, so both are trained with advantages +-1."""
    from functools import partial

    from paravt.models.loading import PolicySpec
    from paravt.modules.grpo import AlgorithmConfig, GRPOModule
    from paravt.rewards.compose import RewardWeights

    class Stage(GRPOModule):
        def _rewards_with_kl(self, trajs, rewards, temperature):
            return torch.tensor([float(i % 2 == 0) for i in range(len(trajs))])

    # experiment=paragrpo's anchor (its tags: single tokens of Qwen's real vocabulary)
    tags = ("</think>", "</tool_call>", "<tool_call>")
    algo = AlgorithmConfig(
        micro_batch_tokens=tokens, norm_length=tokens, anchor_coef=0.1, anchor_tags=tags
    )
    opt = partial(torch.optim.AdamW, lr=2e-6, weight_decay=0.01)
    module = Stage(PolicySpec(path=str(path)), algo, RewardWeights(), opt)
    model.model.visual.requires_grad_(False)  # model.freeze_vision
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    module.policy = model.train()
    return module


def _fit_one_step(module, batch, device: str, out: Path) -> dict[str, float]:
    """One Lightning step of `module` on `batch` as `trainer=fsdp` runs it, on one rank: FSDP2
    (fp32 master weights, bf16 compute on CUDA), precision 32-true; the logged metrics."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy

    class One(pl.LightningDataModule):
        def train_dataloader(self):
            return torch.utils.data.DataLoader([batch], batch_size=None, collate_fn=lambda b: b)

        def transfer_batch_to_device(self, b, device, dataloader_idx):
            return b

    logged: dict[str, float] = {}

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, b, batch_idx):
            logged.update({k: float(v) for k, v in trainer.logged_metrics.items()})

    backend = "nccl" if device == "cuda" else "gloo"
    trainer = pl.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        strategy=ModelParallelStrategy(1, 1, process_group_backend=backend),
        precision="32-true",
        max_steps=1,
        logger=False,
        callbacks=[Record()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        default_root_dir=str(out),
    )
    trainer.fit(module, datamodule=One())
    return logged


def step(opts) -> dict:
    """The recipe's GRPOModule on the real 8B config at 2 and 4 decoder layers (random weights,
    64-frame clip): one training step per token length under FSDP2 on one rank (fp32 master
    weights, bf16 compute, torch AdamW). Checks a finite loss and a finite, non-zero gradient
    norm, and (CUDA) that the peak memory is at most PLAN_MARGIN x the memory plan's update
    phase for the same model; s/token and memory extrapolated linearly to all 36 layers."""
    import math

    lengths, frames, side = _sizes(opts)
    out = Path(opts.out)
    path = processor_dir(out)
    rows: dict[int, dict[int, dict]] = {}
    checks = []
    for layers in (2, 4):
        rows[layers] = {}
        for tokens in lengths:
            model = build_model(layers, opts.device, opts.tiny).float()  # fp32 master weights
            module = _grpo_module(path, model, tokens)
            _peak_reset(opts.device)  # from the resident fp32 weights on (the bf16 build freed)
            batch = _rollout_batch(*clip_inputs(frames, side, tokens, "cpu", opts.tiny)[:3])
            t0 = time.perf_counter()
            logged = _fit_one_step(module, batch, opts.device, out / "lightning")
            seconds = time.perf_counter() - t0
            peak, planned = _peak_gib(opts.device), plan_update_gib(model, tokens, opts.tiny)
            loss = logged.get("loss/loss", math.nan)
            norm = logged.get("grad_norm", math.nan)
            ok = math.isfinite(loss) and math.isfinite(norm) and norm > 0
            ok = ok and (peak is None or peak <= PLAN_MARGIN * planned)
            checks.append(ok)
            rows[layers][tokens] = {
                "s": seconds,
                "peak_gib": peak,
                "plan_gib": planned,
                "loss": loss,
                "grad_norm": norm,
                "ok": ok,
            }
            del model, module
            _peak_reset(opts.device)
    total = QWEN3_VL_8B_TEXT["num_hidden_layers"]
    table = []
    for tokens in lengths:
        two, four = rows[2][tokens], rows[4][tokens]
        row = {
            "tokens": tokens,
            "frames": frames,
            "layers": {str(k): rows[k][tokens] for k in (2, 4)},
            "s_per_token_36l_est": (four["s"] + (total - 4) / 2 * (four["s"] - two["s"])) / tokens,
        }
        if four["peak_gib"] is not None:
            slope = (four["peak_gib"] - two["peak_gib"]) / 2
            row["peak_gib_36l_est"] = four["peak_gib"] + (total - 4) * slope
        table.append(row)
    return {"ok": all(checks), "margin": PLAN_MARGIN, "rows": table}


def rollout_copy(opts) -> dict:
    """The transformers engine's own copy of the 4-layer policy held in fp32 master weights (the
    engine where vLLM is absent, `rollout/engine=hf` with `max_staleness >= 1` or FSDP): its
    device, dtype and bytes, and 8 requests generated with it. ok: on the policy's device, in
    bf16 on CUDA (the memory plan's engine copy), and every log-prob finite and <= 0."""
    from paravt.rollout.engine import EngineConfig, GenerationRequest, SamplingParams
    from paravt.rollout.factory import build_engine
    from paravt.types import Visual

    lengths, frames, side = _sizes(opts)
    model = build_model(4, opts.device, opts.tiny).float().eval()  # fp32 master weights
    processor = _processor(Path(opts.out))
    before = _allocated_gib(opts.device)
    eng = build_engine(EngineConfig(name="hf"), model, processor, share_weights=False)
    copy = getattr(eng, "model", None)
    params = list(copy.parameters()) if copy is not None else []
    dtype = str(params[0].dtype).removeprefix("torch.") if params else None
    copy_gib = sum(p.numel() * p.element_size() for p in params) / 2**30
    ids, pixels, grid, _ = clip_inputs(frames, side, lengths[0] // 2, opts.device, opts.tiny)
    request = GenerationRequest(tuple(ids[0].tolist()), (Visual(pixels.cpu(), grid.cpu()),))
    outs = eng.generate([request] * 8, SamplingParams(max_new_tokens=8, seed=0))
    finite = all(lp <= 0 for group in outs for o in group for lp in o.logprobs)
    want = "bfloat16" if opts.device == "cuda" else "float32"
    on_device = bool(params) and params[0].device.type == opts.device
    return {
        "ok": finite and on_device and dtype == want,
        "dtype": dtype,
        "device": str(params[0].device) if params else None,
        "copy_gib": copy_gib,
        "allocated_gib_delta": _allocated_gib(opts.device) - before,
        "policy_gib": sum(p.numel() * 4 for p in model.parameters()) / 2**30,
    }


def _processor(out: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(processor_dir(out))


def engine(opts) -> dict:
    """TransformersEngine on the 4-layer model: 8 requests with a clip each, tokens/s, memory."""
    from paravt.rollout.engine import GenerationRequest, SamplingParams
    from paravt.rollout.engines.hf import TransformersEngine
    from paravt.types import Visual

    lengths, frames, side = _sizes(opts)
    model = build_model(4, opts.device, opts.tiny).eval()
    eng = TransformersEngine(model, QwenSpecialIds())
    ids, pixels, grid, _ = clip_inputs(frames, side, lengths[0] // 2, opts.device, opts.tiny)
    visual = Visual(pixels.cpu(), grid.cpu())
    requests = [GenerationRequest(tuple(ids[0].tolist()), (visual,)) for _ in range(8)]
    new = 16 if opts.tiny else 128
    params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)
    eng.generate(requests[:1], SamplingParams(max_new_tokens=2, seed=0))  # warm-up
    _peak_reset(opts.device)
    t0 = time.perf_counter()
    outs = eng.generate(requests, params)
    seconds = time.perf_counter() - t0
    sampled = sum(len(o.token_ids) for group in outs for o in group)
    finite = all(lp <= 0 for group in outs for o in group for lp in o.logprobs)
    return {
        "ok": finite and sampled > 0,
        "requests": 8,
        "prompt_tokens": ids.shape[1],
        "sampled_tokens": sampled,
        "tokens_per_s": sampled / seconds,
        "peak_gib": _peak_gib(opts.device),
    }


def gpu_tests(opts) -> dict:
    """`pytest tests/gpu -m "gpu and not vllm"` (no vLLM on the lent machine)."""
    junit = Path(opts.out) / "gpu_tests.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/gpu",
        "-m",
        "gpu and not vllm",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    tail = (done.stdout + done.stderr)[-3000:]
    counts = {}
    if junit.is_file():
        import xml.etree.ElementTree as ET

        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    # pytest exits 5 when nothing was selected (e.g. no CUDA: every test skipped is still 0).
    return {"ok": done.returncode == 0, "returncode": done.returncode, **counts, "tail": tail}
