"""RolloutLogger: the timeline drawing pixel by pixel, the text, and a real TensorBoard run."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from lightning.pytorch.loggers import CSVLogger
from PIL import Image

from paravt.callbacks.crop_figure import MARGIN, PLOT_TOP, PLOT_WIDTH, ROW_HEIGHT, nice_ticks
from paravt.callbacks.rollout_logger import (
    BACKGROUND,
    CROPS,
    TRUTH,
    RolloutLogger,
    crop_windows,
    draw_crop_timeline,
    format_trajectory,
    pick_trajectories,
)
from paravt.types import RewardBreakdown, Turn


def test_timeline_pixels_by_hand():
    # duration 100 s over 100 px: t seconds -> column t. row_height 8 -> pad 2, bars on pixel
    # rows [2, 6) for rollout 0 and [10, 14) for rollout 1.
    rows = [[(10.0, 30.0)], [(50.0, 60.0), (55.0, 90.0)]]
    image = draw_crop_timeline(rows, truth=[(20.0, 40.0)], duration=100.0, width=100, row_height=8)
    assert image.shape == (16, 100, 3) and image.dtype == np.uint8

    def at(y, x):
        return tuple(int(c) for c in image[y, x])

    assert at(3, 9) == BACKGROUND and at(3, 10) == CROPS[0] and at(5, 29) == CROPS[0]
    assert at(3, 30) == TRUTH  # bar [10, 30) ends; truth [20, 40) continues
    assert at(0, 25) == TRUTH and at(15, 39) == TRUTH and at(15, 40) == BACKGROUND
    assert at(1, 15) == BACKGROUND and at(6, 15) == BACKGROUND  # the padding around a bar
    assert at(11, 52) == CROPS[0] and at(11, 55) == CROPS[1] and at(13, 89) == CROPS[1]
    assert at(11, 90) == BACKGROUND and at(9, 70) == BACKGROUND and at(14, 70) == BACKGROUND
    # the second crop of rollout 1 alone wears CROPS[1]: 4 pixel rows x 35 columns [55, 90)
    assert int(np.all(image == CROPS[1], axis=-1).sum()) == 4 * 35


def test_timeline_edges():
    image = draw_crop_timeline(
        [[(50.0, 50.2), (90.0, 150.0), (100.0, 100.0)]], truth=[], duration=100.0, width=100
    )
    bar = np.all(image[8] == CROPS[0], axis=-1) | np.all(image[8] == CROPS[1], axis=-1)
    # a 0.2 s crop still gets 1 px at 50; the end past the video clamps to 100; a crop at the
    # very end gets the last column 99
    assert np.flatnonzero(bar).tolist() == [50, *range(90, 100)]


def test_timeline_rounds_half_up_and_keeps_one_row_without_rollouts():
    # 0.0625 s / 60 s * 480 px = 0.5 -> column 1; 30 s -> 240; no rows -> one row of height 16
    image = draw_crop_timeline([], truth=[(0.0625, 30.0)], duration=60.0)
    assert image.shape == (16, 480, 3)
    shaded = np.flatnonzero(np.all(image[0] == TRUTH, axis=-1))
    assert (shaded[0], shaded[-1]) == (1, 239)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"duration": 0.0}, "duration must be a positive"), ({"width": 0}, "width and row_height")],
)
def test_timeline_rejects_bad_geometry(kwargs, match):
    with pytest.raises(ValueError, match=match):
        draw_crop_timeline([[]], truth=[], **{"duration": 10.0, **kwargs})


@pytest.mark.parametrize(
    ("k", "expected"),
    # order by reward (ties: lower index first): 1 (2.0), 3 (2.0), 0 (0.5), 4 (0.0), 2 (-1.0)
    [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (10, [1, 2, 3, 4, 0])],
)
def test_pick_alternates_best_and_worst(k, expected):
    assert pick_trajectories([0.5, 2.0, -1.0, 2.0, 0.0], k) == expected


def test_pick_from_nothing():
    assert pick_trajectories([], 3) == []


def test_crop_windows_keep_only_successful_crops(toy):
    traj = toy.trajectory("s", 0, crops=[(10.0, 20.0), (30.0, 40.0)], errors=["start >= end"])
    assert crop_windows(traj) == [(10.0, 20.0), (30.0, 40.0)]
    assert crop_windows(toy.trajectory("s", 1)) == []


def test_format_trajectory_shows_every_turn_call_result_and_reward(toy):
    traj = toy.trajectory("s7", 0, crops=[(10.0, 20.0)], errors=["start_time beyond the video"])
    forced = Turn("<answer>B</answer>", forced_answer=True)
    traj = type(traj)(**{**traj.__dict__, "turns": (*traj.turns, forced), "truncated": True})
    reward = RewardBreakdown(1.25, accuracy=1.0, format=0.5, tool=0.0, components={"tool": 0.0})
    text = format_trajectory(traj, reward, "sample `s7`")
    assert text.startswith("### sample `s7`")
    assert "reward 1.250 = accuracy 1.000, format 0.500, tool 0.000" in text
    assert "components: tool 0.000" in text
    assert "calls 2 (valid 1), tool responses 2, rounds 2, finish stop, TRUNCATED" in text
    assert "\n    <think>crop</think>\n" in text  # the model's own text, as an indented block
    assert '- call 0: `crop_video` {"start_time": 10.0}' in text
    assert "- call 1: INVALID (start_time beyond the video): '<tool_code>x'" in text
    assert "- result 0: [10.0, 20.0] s, 2 frames" in text
    assert "- result 1: ERROR start_time beyond the video" in text
    assert "**turn 3** (forced answer)" in text
    assert "DEGENERATE" not in text
    degenerate = format_trajectory(traj, RewardBreakdown(0.0, degenerate=True), "t")
    assert "(DEGENERATE)" in degenerate


def _image(event) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB"))


def test_writes_text_and_timeline_to_tensorboard(tmp_path, toy):
    png = tmp_path / "run" / "crop_timeline.png"
    callback = RolloutLogger(every_n_steps=2, num_trajectories=2, png_path=str(png))
    _, _, log_dir = toy.fit(tmp_path, [callback], max_steps=4)
    events = toy.read_events(log_dir)
    # fires after optimizer steps 2 and 4, i.e. on the rollouts of training steps 1 and 3
    best = {e.step: e.tensor_proto.string_val[0].decode() for e in
            events.Tensors("rollouts/trajectory_0/text_summary")}  # fmt: skip
    worst = {e.step: e.tensor_proto.string_val[0].decode() for e in
             events.Tensors("rollouts/trajectory_1/text_summary")}  # fmt: skip
    assert sorted(best) == sorted(worst) == [1, 3]
    # default scenario: rewards [1, 0, 1, 0] -> best is prompt 0 rollout 0, worst index 3
    # (prompt 1, rollout 1); step 1 is the second batch (p2, p3), step 3 the fourth (p2, p3)
    assert best[1].startswith("### sample `p2` · prompt 0 · rollout 0 · K = 64 · step 1")
    assert "- result 0: [10.0, 20.0] s, 2 frames" in best[1]
    assert worst[3].startswith("### sample `p3` · prompt 1 · rollout 1 · K = 64 · step 3")

    images = {e.step: e for e in events.Images("rollouts/crop_timeline")}
    assert sorted(images) == [1, 3]
    figure = _image(images[1])
    # The title, row labels and axis frame the bars: the figure is larger than the plot.
    assert figure.shape[0] > PLOT_TOP + 2 * ROW_HEIGHT and figure.shape[1] > PLOT_WIDTH
    assert (figure[MARGIN : PLOT_TOP - 4, MARGIN : MARGIN + 200] != 255).any()  # title ink
    labels = figure[PLOT_TOP : PLOT_TOP + 2 * ROW_HEIGHT, MARGIN + PLOT_WIDTH + 8 :]
    assert (labels != 255).any()  # row labels ink
    pixels = figure[PLOT_TOP : PLOT_TOP + 2 * ROW_HEIGHT, MARGIN : MARGIN + PLOT_WIDTH]
    # G = 2 rows of 22 px over 560 px for 60 s: crop and truth [10, 20] s -> columns
    # [round(93.3), round(186.7)) = [93, 187); bars fill pixel rows [5, 17) of row 0.
    assert tuple(pixels[11, 93]) == CROPS[0] and tuple(pixels[11, 186]) == CROPS[0]
    assert tuple(pixels[11, 187]) == BACKGROUND and tuple(pixels[11, 92]) == BACKGROUND
    assert tuple(pixels[33, 120]) == TRUTH  # rollout 1 cropped nothing: only the shading
    assert tuple(pixels[2, 120]) == TRUTH  # rollout 0's padding
    # The last figure is saved as a PNG in the run folder when training ends.
    saved = np.asarray(Image.open(png).convert("RGB"))
    assert np.array_equal(saved, _image(images[3]))


def test_unknown_duration_falls_back_to_the_last_window_end(tmp_path, toy):
    def scenario(step, ids, budgets):
        record = toy.default_scenario(step, ids, budgets)
        return type(record)(**{**record.__dict__, "durations": (0.0,) * len(ids)})

    module = toy.Module(scenario=scenario)
    _, _, log_dir = toy.fit(tmp_path, [RolloutLogger(every_n_steps=1)], module=module, max_steps=1)
    figure = _image(toy.read_events(log_dir).Images("rollouts/crop_timeline")[0])
    pixels = figure[PLOT_TOP:, MARGIN:]
    # span = 20 s (the last end): [10, 20] s -> columns [280, 560)
    assert tuple(pixels[11, 279]) == BACKGROUND and tuple(pixels[11, 280]) == CROPS[0]


@pytest.mark.parametrize("logger", ["csv", False])
def test_without_tensorboard_it_warns_once_and_skips(tmp_path, toy, logger):
    logger = CSVLogger(str(tmp_path)) if logger == "csv" else False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        toy.fit(tmp_path, [RolloutLogger(every_n_steps=1)], logger=logger)
    ours = [w for w in caught if "RolloutLogger writes text and images" in str(w.message)]
    assert len(ours) == 1


@pytest.mark.parametrize("kwargs", [{"every_n_steps": 0}, {"num_trajectories": True}])
def test_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="must be an int >= 1"):
        RolloutLogger(**kwargs)


@pytest.mark.parametrize(
    ("duration", "expected"),
    [(100.0, [0, 20, 40, 60, 80, 100]), (60.0, [0, 10, 20, 30, 40, 50, 60]), (7.5, list(range(8)))],
)
def test_axis_ticks_are_round_seconds(duration, expected):
    # 100 / 8 = 12.5 -> step 20; 60 / 8 = 7.5 -> 10; 7.5 / 8 = 0.94 -> 1
    assert nice_ticks(duration) == expected


def test_row_label_names_reward_and_answer(toy):
    from paravt.callbacks.rollout_logger import _row_label

    traj = toy.trajectory("p0", 1, crops=[(10.0, 20.0)], text="<think>x</think><answer>B</answer>")
    assert _row_label(1, traj, RewardBreakdown(total=0.853)) == "#1 r=0.85 ans: B"
    wordy = toy.trajectory("p0", 0, text="<answer>the red   ball on the left side</answer>")
    assert _row_label(0, wordy, RewardBreakdown(total=0.0)) == "#0 r=0.00 ans: the red ball on t…"
