"""Video-MME with subtitles at the sampled frames only (`subtitles=sampled_frames`, lmms-eval's
rule, the official alternative to all subtitles): timed SRT blocks are kept with the sample and
the prompt shows the blocks whose span holds one of the overview frames it was actually given."""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoProcessor

from paravt.agent.prompts import FRAME_SUBTITLES, subtitles_at, user_text
from paravt.eval.adapters import get_benchmark
from paravt.eval.adapters.videomme import parse_srt_blocks
from paravt.types import Sample

SRT = (
    '\ufeff1\r\n00:00:01,000 --> 00:00:02,500\r\n<font color="#ffffff">Hello &amp; bye</font>\r\n'
    "\r\n2\r\n00:00:03,000 --> 00:00:04,000\r\nsecond line\r\n100\r\n"
    "\r\n3\r\n00:01:00,250 --> 00:01:02,000\r\nlate\r\n"
)
SRT_BLOCKS = tuple(parse_srt_blocks(SRT))


def test_timed_blocks_are_parsed_with_seconds_tags_and_entities():
    assert parse_srt_blocks(SRT) == [
        (1.0, 2.5, "Hello & bye"),
        (3.0, 4.0, "second line\n100"),
        (60.25, 62.0, "late"),  # 1 min 0.25 s
    ]


def test_only_blocks_holding_a_sampled_frame_are_kept_in_order():
    blocks = parse_srt_blocks(SRT)
    assert subtitles_at(blocks, [3.5, 1.0]) == ["Hello & bye", "second line\n100"]
    assert subtitles_at(blocks, [2.5, 4.0, 59.0]) == []  # ends are exclusive; 59 s is before
    assert subtitles_at(blocks, [61.9]) == ["late"]


def test_the_prompt_carries_the_subtitles_of_its_own_frames():
    sample = Sample(
        id="q",
        video="v.mp4",
        question="Question: x?",
        answer="A",
        extra={FRAME_SUBTITLES: SRT_BLOCKS},
    )
    text = user_text(sample, [0.0, 3.2], 64.0)
    assert text.endswith(
        "frames at 0.0s, 3.2s.\nThis video's subtitles are listed below:\nsecond line\n100\n\n"
        "Question: x?"
    )
    assert user_text(sample, [0.0, 10.0], 64.0).endswith("frames at 0.0s, 10.0s.\nQuestion: x?")


def _row(video_id: str) -> dict:
    return {
        "video_id": "001",
        "duration": "short",
        "domain": "Knowledge",
        "sub_category": "Humanity",
        "url": "https://www.youtube.com/watch?v=x",
        "videoID": video_id,
        "question_id": "001-1",
        "task_type": "OCR",
        "question": "What is said?",
        "options": ["A. Hello.", "B. Bye.", "C. Late.", "D. Nothing."],
        "answer": "A",
    }


@pytest.fixture
def videomme_sub_files(tmp_path, write_parquet, needle_dir):
    """One Video-MME row on a real 64 s needle mp4, with an SRT: blocks at 1-2.5 s, 3-4 s, and
    one at 60.25-62 s."""
    videos, subs = tmp_path / "videos", tmp_path / "subs"
    videos.mkdir()
    subs.mkdir()
    shutil.copy(sorted((needle_dir / "videos").glob("*.mp4"))[0], videos / "vid.mp4")
    (subs / "vid.srt").write_text(SRT, encoding="utf-8")
    return write_parquet([_row("vid")]), str(videos), str(subs)


def test_the_agent_loop_shows_the_subtitles_at_the_overview_frames(
    videomme_sub_files, tiny_qwen3_dir
):
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    ann, root, subs = videomme_sub_files
    bench = get_benchmark("videomme_sub", subtitle_root=subs, subtitles="sampled_frames")
    [item] = bench.load(ann, root)
    assert item.sample.question.startswith("Question: ")  # no subtitle text at load
    assert item.sample.extra[FRAME_SUBTITLES] == SRT_BLOCKS and item.sample.extra["has_subtitles"]
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    engine = ScriptedEngine(processor.tokenizer, lambda context: "<answer>A</answer>")
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=0))
    with VideoReader() as reader:
        info = reader.info(item.sample.video)
    shown = {}
    for budget in (2, 16):
        [traj] = loop.run([item.sample], [budget], 1, SamplingParams(greedy=True))
        prompt = processor.tokenizer.decode(traj.token_ids[: traj.prompt_length])
        shown[budget] = [t for _, _, t in SRT_BLOCKS if t in prompt]
    # 64 s at 2 fps = 128 frames. 2 bin centres: frames 32, 96 = 16 s, 48 s: no block.
    # 16: frames 4, 12, ..., 124 = 2 s, 6 s, ..., 62 s: 2 s is in [1, 2.5); 62 s is the last
    # block's (exclusive) end, so only the first block is shown.
    assert info.duration == pytest.approx(64.0, abs=1.0)
    assert shown[2] == []
    assert shown[16] == ["Hello & bye"]


def test_an_unknown_subtitle_rule_is_refused(tmp_path):
    with pytest.raises(ValueError, match="sampled_frames"):
        get_benchmark("videomme_sub", subtitle_root=str(tmp_path), subtitles="some")
