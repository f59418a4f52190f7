"""The tiny checkpoints are real transformers Qwen-VL models that load, see videos and generate."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor
from transformers.video_utils import VideoMetadata

from paravt.cli import main as cli_main
from paravt.models.tiny import SPECIAL_TOKENS, TAG_TOKENS, TinyModelConfig, build_tiny_model

ARCH_DIRS = {"qwen3_vl": "tiny_qwen3_dir", "qwen2_5_vl": "tiny_qwen25_dir"}


def _load(request, arch):
    path = request.getfixturevalue(ARCH_DIRS[arch])
    return AutoProcessor.from_pretrained(path), AutoModelForImageTextToText.from_pretrained(path)


def _video_inputs(proc, frames, indices, fps, total):
    msgs = [
        {"role": "system", "content": "You are a video agent."},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What colour?"}]},
    ]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    meta = VideoMetadata(total_num_frames=total, fps=fps, frames_indices=list(indices))
    return proc(text=[text], videos=[frames], video_metadata=[meta], return_tensors="pt")


@pytest.mark.parametrize("arch", ["qwen3_vl", "qwen2_5_vl"])
def test_loads_forwards_and_generates_with_a_video(request, arch):
    proc, model = _load(request, arch)
    assert type(model).__name__.startswith("Qwen3VL" if arch == "qwen3_vl" else "Qwen2_5_VL")
    frames = np.random.default_rng(0).integers(0, 255, (4, 64, 64, 3), dtype=np.uint8)
    inputs = _video_inputs(proc, frames, [0, 40, 80, 120], 2.0, 128)
    video_id = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    # 4 frames -> 2 temporal groups; 64 px frames -> (64/16)^2=16 patches (qwen3: 2x2 merged = 4
    # tokens per group, 8 in all); qwen2.5 resizes 64->56: (56/14)^2=16 patches -> 4 tokens per
    # group, 8 in all.
    assert int((inputs["input_ids"] == video_id).sum()) == 8
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape[:2] == inputs["input_ids"].shape
    assert torch.isfinite(out.logits).all()
    gen = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] > inputs["input_ids"].shape[1]


def test_qwen3_renders_true_timestamps_and_no_nested_vision_blocks(request):
    proc, _ = _load(request, "qwen3_vl")
    frames = np.zeros((4, 64, 64, 3), dtype=np.uint8)
    # Frames 0, 40, 80, 120 at 2 fps are at 0, 20, 40, 60 s; Qwen3-VL labels each 2-frame group
    # with the mean time of its frames: (0+20)/2 = 10.0 and (40+60)/2 = 50.0.
    ids = _video_inputs(proc, frames, [0, 40, 80, 120], 2.0, 128)["input_ids"][0]
    text = proc.tokenizer.decode(ids)
    assert "<10.0 seconds><|vision_start|>" in text and "<50.0 seconds><|vision_start|>" in text
    start = proc.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    end = proc.tokenizer.convert_tokens_to_ids("<|vision_end|>")
    depth = 0
    for tok in ids.tolist():
        depth += (tok == start) - (tok == end)
        assert depth in (0, 1), "vision blocks are nested"
    assert depth == 0


def test_tokenizer_has_every_special_token_and_single_digits(tiny_qwen3_dir):
    tok = AutoProcessor.from_pretrained(tiny_qwen3_dir).tokenizer
    for t in SPECIAL_TOKENS + TAG_TOKENS:
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    digits = tok.convert_ids_to_tokens(tok.encode("12.75", add_special_tokens=False))
    assert digits == ["1", "2", ".", "7", "5"]
    # Tags survive decoding; chat-control tokens are skippable.
    ids = tok.encode("<|im_start|><think>x</think>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<think>x</think>"


def test_chat_template_renders_tool_messages_as_one_user_segment(tiny_qwen3_dir):
    proc = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
        {"role": "tool", "content": [{"type": "text", "text": "a"}, {"type": "video"}]},
        {"role": "tool", "content": "b"},
    ]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>{}</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na<|video_pad|>\n</tool_response>"
        "\n<tool_response>\nb\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_vision_settings_match_the_real_models(tiny_qwen3_dir, tiny_qwen25_dir):
    for path, patch in ((tiny_qwen3_dir, 16), (tiny_qwen25_dir, 14)):
        cfg = json.loads((path / "config.json").read_text())["vision_config"]
        assert (cfg["patch_size"], cfg["spatial_merge_size"], cfg["temporal_patch_size"]) == (
            patch,
            2,
            2,
        )


def test_build_is_deterministic_for_a_seed(tmp_path):
    cfg = TinyModelConfig("qwen3_vl", hidden_size=32, num_layers=1)
    a = AutoModelForImageTextToText.from_pretrained(build_tiny_model(tmp_path / "a", cfg))
    b = AutoModelForImageTextToText.from_pretrained(build_tiny_model(tmp_path / "b", cfg))
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (
        tmp_path / "b" / "tokenizer.json"
    ).read_text()
    for (na, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), na
    c = AutoModelForImageTextToText.from_pretrained(
        build_tiny_model(
            tmp_path / "c", TinyModelConfig("qwen3_vl", hidden_size=32, num_layers=1, seed=1)
        )
    )
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_cli_writes_a_loadable_checkpoint(tmp_path, capsys):
    out = tmp_path / "m"
    assert (
        cli_main(
            ["make-tiny-model", "--arch", "qwen2_5_vl", "--out", str(out), "--hidden-size", "32"]
        )
        == 0
    )
    assert "qwen2_5_vl" in capsys.readouterr().out
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert model.config.text_config.hidden_size == 32


def test_unknown_cli_command_is_named(capsys):
    assert cli_main(["make-tiny"]) == 2
    assert "unknown command 'make-tiny'" in capsys.readouterr().err


def test_tiny_checkpoint_is_rebuilt_when_the_asked_sizes_differ(tmp_path):
    import json

    from paravt.models.loading import ensure_tiny

    path = tmp_path / "tiny"
    ensure_tiny(path, "qwen3_vl", {"hidden_size": 32, "num_heads": 2})
    assert json.loads((path / "config.json").read_text())["text_config"]["hidden_size"] == 32
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    ensure_tiny(path, "qwen3_vl", {"hidden_size": 32, "num_heads": 2})  # same sizes: kept
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    ensure_tiny(path, "qwen3_vl", {"hidden_size": 48, "num_heads": 2})
    assert json.loads((path / "config.json").read_text())["text_config"]["hidden_size"] == 48


def test_tiny_sizes_with_an_unknown_key_are_refused_with_the_valid_keys(tmp_path):
    import pytest

    from paravt.models.loading import ensure_tiny

    with pytest.raises(ValueError, match="valid keys"):
        ensure_tiny(tmp_path / "tiny", "qwen3_vl", {"hiden_size": 32})


@pytest.mark.parametrize(
    ("sizes", "said"),
    [
        ({"hidden_size": 0}, "hidden_size must be an integer >= 1, got 0"),
        ({"num_heads": 3}, "hidden_size=64 over num_heads=3 must give an even head size >= 8"),
        ({"hidden_size": 12, "num_heads": 2}, "=12 over num_heads=2 must give an even head size"),
        ({"num_kv_heads": 2, "num_heads": 4, "hidden_size": 64}, None),  # 16 per head: fine
        ({"num_heads": 4, "num_kv_heads": 3}, "num_heads=4 must be a multiple of num_kv_heads=3"),
        ({"vision_depth": True}, "vision_depth must be an integer >= 1, got True"),
    ],
)
def test_sizes_no_model_is_built_from_are_refused_naming_them(tmp_path, sizes, said, capsys):
    """Before: a ZeroDivisionError (hidden_size=0) or a model whose rotary sections do not add
    up. The CLI says it in its own flags, exit 2."""
    if said is None:
        assert TinyModelConfig(**sizes).num_heads == sizes["num_heads"]
        return
    with pytest.raises(ValueError, match=said):
        TinyModelConfig(**sizes)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in sizes.items() if not isinstance(v, bool)]
    if flags:
        with pytest.raises(SystemExit) as exited:
            cli_main(["make-tiny-model", "--out", str(tmp_path / "m"), *flags])
        assert (
            exited.value.code == 2
            and "paravt make-tiny-model: error: --" in capsys.readouterr().err
        )
        assert not (tmp_path / "m").exists()


def test_tiny_qwen3_image_and_video_processors_share_the_normalisation(tmp_path):
    from transformers import AutoProcessor

    from paravt.models.tiny import build_tiny_model

    proc = AutoProcessor.from_pretrained(build_tiny_model(tmp_path / "t"))
    assert list(proc.image_processor.image_mean) == list(proc.video_processor.image_mean)
    assert list(proc.image_processor.image_std) == list(proc.video_processor.image_std)
