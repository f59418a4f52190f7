"""The tiny model's vision path is learnable: it reads a clip's colour off the frames.

A probe through the real processor (real fps and frame indices in the video metadata) and the
real tiny Qwen3-VL: a 64x64 clip of 4 frames, a 20x20 square of one of 4 colours on noisy grey in
the middle 2 frames, "What colour is the square?" -> the colour's first token, trained with the
LM's full-vocabulary cross-entropy. Guards against a vision path that silently carries nothing
(wrong placeholder expansion, dropped pixel values, a broken processor setting).
"""

from __future__ import annotations

import math

import numpy as np
import torch

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 190, 50),
    "blue": (40, 70, 230),
    "yellow": (235, 215, 30),
}
PROMPT = (
    "<|im_start|>user\n<|video_pad|>What colour is the square?<|im_end|>\n"
    "<|im_start|>assistant\n<answer>"
)


def _clip(rng: np.random.Generator, colour: str) -> np.ndarray:  # [4, 64, 64, 3] uint8
    frames = (128 + rng.integers(0, 8, (4, 64, 64, 3))).astype(np.uint8)
    x, y = (int(v) for v in rng.integers(0, 44, 2))
    frames[1:3, y : y + 20, x : x + 20] = COLOURS[colour]
    return frames


def _batch(processor, rng: np.random.Generator, n: int):
    from transformers.video_utils import VideoMetadata

    labels = rng.integers(0, len(COLOURS), n)
    names = list(COLOURS)
    meta = VideoMetadata(
        total_num_frames=64, fps=1.0, frames_indices=[8, 24, 40, 56], duration=64.0
    )
    inputs = processor(
        text=[PROMPT] * n,
        videos=[_clip(rng, names[int(c)]) for c in labels],
        video_metadata=[meta] * n,
        do_sample_frames=False,
        return_tensors="pt",
        padding=True,
    )
    return inputs, torch.as_tensor(labels)


def _next_token_logits(model, inputs) -> torch.Tensor:  # [N, V]
    return model(**inputs, use_cache=False).logits[:, -1]


def _accuracy(model, batches, targets: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        hits = sum(
            int((_next_token_logits(model, x).argmax(-1) == targets[y]).sum()) for x, y in batches
        )
    model.train()
    return hits / sum(len(y) for _, y in batches)


def test_tiny_qwen3_vl_learns_to_read_a_colour_off_video_frames(tiny_qwen3_dir, steps=60):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.manual_seed(0)
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    processor.tokenizer.padding_side = "left"
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)  # vision trainable
    tok = processor.tokenizer
    targets = torch.tensor([tok(c, add_special_tokens=False)["input_ids"][0] for c in COLOURS])
    assert len(set(targets.tolist())) == len(COLOURS), (
        "colour names must start with distinct tokens"
    )
    held_out = [_batch(processor, np.random.default_rng(1000 + i), 32) for i in range(2)]
    before = _accuracy(model, held_out, targets)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))
    rng, warmup = np.random.default_rng(0), 6
    for step in range(steps):
        progress = max(0, step - warmup) / (steps - warmup)
        scale = min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = 3e-3 * scale
        inputs, labels = _batch(processor, rng, 16)
        loss = torch.nn.functional.cross_entropy(_next_token_logits(model, inputs), targets[labels])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    after = _accuracy(model, held_out, targets)
    assert before < 0.5, before  # an untrained model does not already know (chance is 0.25)
    assert after >= 0.9, (before, after)
