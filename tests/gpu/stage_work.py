"""The work of each GPU-script stage (tests/gpu/stages.py runs one per subprocess).

Each function takes the parsed options and returns a JSON-able dict. The model stages build the
real Qwen3-VL-8B configuration (`qwen3_vl_8b_config`) with random weights, truncated to a few
decoder layers, so no checkpoint and no network are needed; `--tiny` swaps in a small config of
the same architecture so that the CPU tests (tests/gpu/test_stages.py) run the same code.
"""

from __future__ import annotations

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
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _allocated_gib(device: str) -> float:
    return torch.cuda.memory_allocated() / 2**30 if device == "cuda" else 0.0


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def grpo_micro_step(model, opt, ids, pixels, grid, device: str) -> float:
    """One GRPO micro-step: chunked log-probs of every token through the lm_head, the PPO loss
    over a random advantage, backward, the optimiser step. Returns seconds."""
    from paravt.models.head_logprobs import head_logprobs, shift_head_output
    from paravt.rl.losses import ppo_clip_loss

    t0 = time.perf_counter()
    suppress = [QWEN_IDS[k] for k in ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>")]
    mm = (ids == QWEN_IDS["<|video_pad|>"]).long() * 2
    with head_logprobs(model, ids, 0.7, suppress, 1024, True):
        out = model(
            input_ids=ids,
            pixel_values_videos=pixels,
            video_grid_thw=grid,
            mm_token_type_ids=mm,
            use_cache=False,
        )
    logp, _ = shift_head_output(out.logits)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, : ids.shape[1] // 2] = False  # the prompt half is not trained
    old = logp.detach() + 0.01 * torch.randn_like(logp)
    adv = torch.tensor([1.0], device=ids.device)
    loss, _ = ppo_clip_loss(logp, old, adv, mask, 0.2, 0.28)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _sizes(opts) -> tuple[list[int], int, int]:
    """(token lengths, frames, frame side) of the model stages."""
    if opts.tiny:
        return [256, 512], 8, 32
    return [4096, 8192, 16384], 64, 224


def plan_update_gib(tokens: int, tiny: bool) -> float:
    """What `paravt check-recipe`'s memory plan (paravt.run.memory_plan) expects the update of
    one `tokens`-token micro-batch to add on top of the resident weights and optimiser state,
    at all decoder layers: activations with checkpointing, the chunked head's [chunk, V]
    buffers, and the bf16 gradients of the trainable language model (the step stage trains in
    bf16, vision frozen). The measured counterpart is the stage's peak minus what was
    allocated before."""
    from paravt.run.memory_plan import GIB, ModelSize, PlanInputs, plan

    text = TINY_TEXT if tiny else QWEN3_VL_8B_TEXT
    size = ModelSize(
        name="step stage",
        total_params=0,
        layers=text["num_hidden_layers"],
        hidden=text["hidden_size"],
        intermediate=text["intermediate_size"],
        kv_heads=text["num_key_value_heads"],
        head_dim=text["head_dim"],
        vocab=text["vocab_size"],
    )
    inputs = PlanInputs(
        world=1,
        prompts_per_rank=1,
        group_size=1,
        max_total_tokens=tokens,
        micro_batch_tokens=tokens,
        kl=False,
        freeze_vision=True,
        adam_bytes=4,
        engine="hf",
        vllm_share=0.0,
        sleep_mode=False,
        checkpointing=True,
        gpu_gb=141.0,
    )
    acts = plan(size, inputs)["update: activations, checkpointing"]
    return (acts + 2 * size.lm_params) / GIB


def step(opts) -> dict:
    """One GRPO micro-step of the real 8B config at 2 and 4 decoder layers, per token length:
    peak memory and s/token, and both extrapolated linearly in the layers to all 36; beside the
    measured update memory (peak minus what was allocated before the step), the memory plan's
    estimate of it (`plan_update_gib`), so a GPU run confirms or corrects the plan."""
    lengths, frames, side = _sizes(opts)
    rows: dict[int, dict[int, dict]] = {}
    for layers in (2, 4):
        model = build_model(layers, opts.device, opts.tiny)
        model.model.visual.requires_grad_(
            False
        )  # model.freeze_vision, as conf/model/qwen3_vl_8b.yaml
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-6)
        warm = clip_inputs(frames, side, lengths[0], opts.device, opts.tiny)
        grpo_micro_step(model, opt, *warm[:3], opts.device)
        rows[layers] = {}
        for tokens in lengths:
            ids, pixels, grid, n_video = clip_inputs(frames, side, tokens, opts.device, opts.tiny)
            _peak_reset(opts.device)
            before = _allocated_gib(opts.device)
            seconds = grpo_micro_step(model, opt, ids, pixels, grid, opts.device)
            peak = _peak_gib(opts.device)
            rows[layers][tokens] = {
                "peak_gib": peak,
                "update_gib": None if peak is None else peak - before,
                "s": seconds,
                "video_tokens": n_video,
            }
        del model, opt
        _peak_reset(opts.device)
    total = QWEN3_VL_8B_TEXT["num_hidden_layers"]
    out = []
    for tokens in lengths:
        two, four = rows[2][tokens], rows[4][tokens]
        row = {
            "tokens": tokens,
            "frames": frames,
            "video_tokens": four["video_tokens"],
            "s_per_token_4l": four["s"] / tokens,
            "s_per_token_36l_est": (four["s"] + (total - 4) / 2 * (four["s"] - two["s"])) / tokens,
            "plan_update_gib_36l": plan_update_gib(tokens, opts.tiny),
        }
        if four["peak_gib"] is not None:
            slope = (four["peak_gib"] - two["peak_gib"]) / 2
            update_slope = (four["update_gib"] - two["update_gib"]) / 2
            row |= {
                "peak_gib_4l": four["peak_gib"],
                "peak_gib_36l_est": four["peak_gib"] + (total - 4) * slope,
                "update_gib_36l_est": four["update_gib"] + (total - 4) * update_slope,
            }
        out.append(row)
    return {"ok": True, "rows": out}


def engine(opts) -> dict:
    """TransformersEngine on the 4-layer model: 8 requests with a clip each, tokens/s, memory."""
    from paravt.rollout.engine import GenerationRequest, SamplingParams
    from paravt.rollout.hf import TransformersEngine
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
