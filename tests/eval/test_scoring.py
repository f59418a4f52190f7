from __future__ import annotations

import pytest

from paravt.eval import scoring

OPTS4 = ("Apples", "Bananas", "Cherries", "Dates")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("B", "B"),
        ("<answer>B</answer>", "B"),
        ("<answer>(b)</answer>", "B"),
        ("<answer>B. Bananas</answer>", "B"),
        # The article "A" before the tag must not read as option A.
        ("A person opens the fridge.\n<answer>B</answer>", "B"),
        ("<think>A man eats. Maybe C.</think><answer>B</answer>", "B"),
        # The think block is never read, even when nothing follows it.
        ("<think>The answer is C.</think>", None),
        # The last closed answer wins (the forced-answer round comes last).
        ("<answer>A</answer> more tools <answer>D</answer>", "D"),
        # Option text inside the tag.
        ("<answer>Cherries</answer>", "C"),
        # A letter outside the sample's options is no answer.
        ("<answer>E</answer>", None),
        # No tags: the last line says nothing, so the whole text is read.
        ("The answer is B.\nA person eats it because it is yellow.", "B"),
        ("A person eats a banana.", None),
        ("Answer: A person", None),
        ("A and B are wrong; the answer is C", "C"),
        ("<think>hmm</think>\n\nD", "D"),
        ('<tool_call>{"name": "crop_video", "arguments": {"A": 1}}</tool_call>', None),
        ("", None),
    ],
)
def test_extract_choice_hard_cases(response, expected):
    assert scoring.extract_choice(response, OPTS4) == expected


def test_letters_are_restricted_to_the_sample_options():
    # Two options: "C" is not a letter of this sample.
    assert scoring.extract_choice("<answer>C</answer>", ("x", "y")) is None
    assert scoring.score_choice("<answer>C</answer>", "C", ("x", "y")) == {"correct": 0.0}
    assert scoring.score_choice("<answer>b</answer>", "B", ("x", "y")) == {"correct": 1.0}


def test_option_letters_rejects_bad_counts():
    assert scoring.option_letters(4) == "ABCD"
    with pytest.raises(ValueError, match=r"1\.\.10 options"):
        scoring.option_letters(0)


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        # inter = 15 - 12 = 3; span = 20 - 10 = 10 -> 0.3
        ((10.0, 15.0), (12.0, 20.0), 0.3),
        ((10.0, 20.0), (10.0, 20.0), 1.0),
        # contained: inter 2, span 10 -> 0.2
        ((12.0, 14.0), (10.0, 20.0), 0.2),
        ((0.0, 5.0), (6.0, 9.0), 0.0),  # disjoint
        ((5.0, 5.0), (5.0, 5.0), 0.0),  # degenerate
        ((15.0, 10.0), (12.0, 20.0), 0.3),  # reversed prediction sorted
        ((float("nan"), 1.0), (0.0, 1.0), 0.0),
    ],
)
def test_interval_iou(pred, gold, expected):
    assert scoring.interval_iou(pred, gold) == pytest.approx(expected)


def test_score_grounding_thresholds_and_unparseable():
    # pred 10-15 vs gold 12-20: IoU 0.3 -> r@0.3 hit (>=), r@0.5 / r@0.7 miss.
    got = scoring.score_grounding(
        "<think>x</think><answer>The event happens in the 10.0 - 15.0 seconds.</answer>",
        (12.0, 20.0),
    )
    assert got == pytest.approx({"iou": 0.3, "r@0.3": 1.0, "r@0.5": 0.0, "r@0.7": 0.0})
    # m:ss form, no tags: 0:12 - 0:20 = 12-20 -> IoU 1.
    assert scoring.score_grounding("It is 0:12 - 0:20.", (12.0, 20.0))["iou"] == 1.0
    assert scoring.score_grounding("no idea", (12.0, 20.0)) == {
        "iou": 0.0,
        "r@0.3": 0.0,
        "r@0.5": 0.0,
        "r@0.7": 0.0,
    }
    # The think block's numbers are not the answer.
    assert scoring.score_grounding("<think>12 - 20</think>", (12.0, 20.0))["iou"] == 0.0


def test_mean_of_nothing_is_zero():
    assert scoring.mean([]) == 0.0  # an empty benchmark reports zeros, not NaN
    assert scoring.mean([1.0, 0.0, 0.5]) == 0.5  # (1 + 0 + 0.5) / 3


def test_lmms_means_are_plain_means_overall_and_per_group():
    from paravt.eval.adapters.base import EvalItem, lmms_means
    from paravt.types import Sample

    def item(i, *labels):
        return EvalItem(Sample(f"q{i}", "v.mp4", "Q?", "A"), {"task": labels})

    items = [item(0, "a"), item(1, "a"), item(2, "b"), item(3)]
    scores = [{"c": 1.0}, {"c": 0.0}, {"c": 1.0}, {}]  # the last has no lmms-eval score
    # overall (1 + 0 + 1) / 3; task=a (1 + 0) / 2; task=b 1 / 1
    got = lmms_means(items, scores, "c", "acc")
    assert got == pytest.approx({"acc": 2 / 3, "acc/task=a": 0.5, "acc/task=b": 1.0})
    assert lmms_means(items, [{}, {}, {}, {}], "c", "acc") == {}
