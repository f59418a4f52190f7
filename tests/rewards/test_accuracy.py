"""Answer extraction, normalisation, option letters, intervals and R_acc."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt.rewards.accuracy import (
    OPEN_ENDED_SCORERS,
    accuracy_reward,
    exact_match,
    extract_answer,
    extract_option_letter,
    mcq_accuracy,
    normalize_text,
    parse_interval,
    temporal_iou,
    token_f1,
    tvg_accuracy,
)

# ------------------------------------------------------------------ extract_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>\nhmm</think><answer> B </answer>", "B"),
        # The LAST closed answer wins (a later turn revises the earlier one).
        ("<answer>A</answer> more <answer>C</answer>", "C"),
        # No answer tags: what follows the last </think>, tool blocks removed.
        ('<think>\nx</think> <tool_call>{"a": 1}</tool_call> It is red.', "It is red."),
        ("<think>\nx</think><tool_code>print(1)</tool_code>blue", "blue"),
        # An <answer> cut off before its closing tag is still read.
        ("<think>\nx</think>\n<answer>B", "B"),
        # Only reasoning and a tool call after it: no answer, the think is not read as one.
        ("<think>\nmaybe B</think><tool_call>{}</tool_call>", ""),
        # An unclosed tool block swallows the rest of the text.
        ("<think>\nx</think>green<tool_call>{ broken", "green"),
        # No </think>: the last non-empty line.
        ("first line\n\nthe answer is D\n\n", "the answer is D"),
        ("", ""),
        ("   \n  ", ""),
        # Stray tags around the last pair: the innermost closed content.
        ("<answer>A<answer>B</answer>", "B"),
        ("<answer>A</answer> junk </answer>", "A"),
    ],
)
def test_extract_answer(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


def test_extract_answer_reads_the_last_turn_of_a_multi_turn_trajectory() -> None:
    text = (
        "<think>\nI should crop.</think>\n<tool_call>{}</tool_call>\n"
        "<think>\nThe clip shows red.</think>\nThe answer is A"
    )
    assert extract_answer(text) == "The answer is A"


# ------------------------------------------------------------------ normalisation and open-ended


def test_normalize_text() -> None:
    assert normalize_text("  The Red,  CAR! ") == "red car"
    assert normalize_text("An apple — a day") == "apple day"
    # Articles go only as whole words: "theater" and "cat" keep their letters.
    assert normalize_text("the theater cat") == "theater cat"
    assert normalize_text("“Quoted”…") == "quoted"


def test_exact_match_and_token_f1() -> None:
    assert exact_match("The red car.", "red car") == 1.0
    assert exact_match("red", "blue") == 0.0
    # Both sides normalise to nothing: not a match (an empty answer earns nothing).
    assert exact_match("the", "a") == 0.0
    # pred {red, car, parked} vs gold {red, car}: overlap 2, P = 2/3, R = 1, F1 = 0.8
    assert token_f1("a red car parked", "the red car") == pytest.approx(0.8)
    # Counts matter: pred "red red", gold "red": overlap 1, P = 1/2, R = 1, F1 = 2/3
    assert token_f1("red red", "red") == pytest.approx(2 / 3)
    assert token_f1("", "red") == 0.0
    assert token_f1("blue", "red") == 0.0
    assert set(OPEN_ENDED_SCORERS) == {"f1", "exact"}


# ------------------------------------------------------------------ option letters


@pytest.mark.parametrize(
    "text",
    [
        "B",
        "B.",
        "(B)",
        "B)",
        "b",
        "**B**",
        "B. red",
        "(B) red",
        "B: the red one",
        "The answer is B",
        "The answer is B.",
        "Answer: B",
        "answer: (B)",
        "The correct answer is option B because the square is red.",
        "the answer is b.",
        "I choose B",
        "A person walks in. The answer is B.",
        "B is correct",
        "I think B is the answer",
        "I think B fits",
        "A man opens the door, so B",
        "The answer is A. No wait, the answer is B.",
    ],
)
def test_extract_option_letter_reads_b(text: str) -> None:
    assert extract_option_letter(text, "ABCD") == "B"


@pytest.mark.parametrize(
    "text",
    [
        "A person walks to the door",  # the article, not option A
        "A red car is parked",
        "I think so",  # the pronoun, not option I
        "the answer is a red car",  # lower-case article after "is"
        "The answer is A person opening the door",  # capital article after "is"
        "between A and B",  # two candidates: undecided
        "",
        "nothing here",
    ],
)
def test_extract_option_letter_refuses_words_and_ambiguity(text: str) -> None:
    assert extract_option_letter(text, "ABCDEFGHIJ") is None


def test_extract_option_letter_is_restricted_to_the_samples_letters() -> None:
    assert extract_option_letter("E", "ABCD") is None
    assert extract_option_letter("The answer is E", "ABCD") is None
    assert extract_option_letter("The answer is E", "ABCDE") == "E"


def test_extract_option_letter_by_option_text() -> None:
    options = ("blue", "red", "green", "dark red")
    assert extract_option_letter("the red one", "ABCD", options) == "B"
    # "dark red" contains "red": the longer option wins.
    assert extract_option_letter("It is dark red.", "ABCD", options) == "D"
    assert extract_option_letter("Green", "ABCD", options) == "C"
    # "red" is a substring of "bored" but not a word of it: two options named, undecided.
    assert extract_option_letter("bored, red", "AB", ("bored", "red")) is None
    # Two different options named: undecided.
    assert extract_option_letter("blue or green", "ABCD", options) is None
    # Option texts carrying their own letter prefix are matched without it.
    assert extract_option_letter("green", "ABC", ("A. blue", "B. red", "C. green")) == "C"


def test_a_person_sentence_matching_option_b_is_b_not_a() -> None:
    options = ("a dog barking", "a person opening the door", "a cat", "nothing")
    assert extract_option_letter("A person opening the door.", "ABCD", options) == "B"
    assert mcq_accuracy("A person opening the door.", "B", options) == 1.0
    assert mcq_accuracy("A person opening the door.", "A", options) == 0.0


def test_mcq_accuracy() -> None:
    assert mcq_accuracy("The answer is (C).", "C") == 1.0
    assert mcq_accuracy("The answer is (C).", "(c)") == 1.0
    assert mcq_accuracy("C", "B") == 0.0
    # The gold may be the option text itself.
    assert mcq_accuracy("B", "red", ("blue", "red")) == 1.0
    # Four options: a fifth letter is never valid, not even as the gold.
    assert mcq_accuracy("E", "E", ("a", "b", "c", "d")) == 0.0
    assert mcq_accuracy("anything", "not a letter") == 0.0


# ------------------------------------------------------------------ intervals


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[12.5, 20]", (12.5, 20.0)),
        ("(12.5, 20.0)", (12.5, 20.0)),
        ("The event happens at 12.5 - 20 seconds.", (12.5, 20.0)),
        ("from 12.5 to 20", (12.5, 20.0)),
        ("between 3 and 4.5 s", (3.0, 4.5)),
        ("12.5s–20s", (12.5, 20.0)),
        ("12.5 — 20", (12.5, 20.0)),
        ("00:12-00:20", (12.0, 20.0)),
        ("01:30 to 02:05", (90.0, 125.0)),  # 1*60+30 = 90, 2*60+5 = 125
        ("0:01:05 – 0:01:10", (65.0, 70.0)),  # HH:MM:SS: 60+5 = 65, 60+10 = 70
        ("1:00:00-1:00:30", (3600.0, 3630.0)),
        ("[20, 12.5]", (12.5, 20.0)),  # reversed: swapped
        ("first [1, 2] then [3, 4]", (1.0, 2.0)),  # the first one
    ],
)
def test_parse_interval(text: str, expected: tuple[float, float]) -> None:
    assert parse_interval(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", ["", "no numbers", "at 12 seconds", "Qwen2.5-VL", "9" * 400 + " to 3"]
)
def test_parse_interval_none(text: str) -> None:
    assert parse_interval(text) is None


def test_temporal_iou() -> None:
    # [0, 10] vs [5, 15]: inter 5, union 15 -> 1/3
    assert temporal_iou((0, 10), (5, 15)) == pytest.approx(1 / 3)
    # [2, 4] inside [0, 10]: inter 2, union 10 -> 0.2
    assert temporal_iou((2, 4), (0, 10)) == pytest.approx(0.2)
    assert temporal_iou((0, 1), (2, 3)) == 0.0  # disjoint
    assert temporal_iou((0, 5), (5, 10)) == 0.0  # touching
    assert temporal_iou((10, 0), (5, 15)) == pytest.approx(1 / 3)  # reversed pred is sorted
    assert temporal_iou((3, 3), (3, 3)) == 0.0  # degenerate: union 0
    assert temporal_iou((0, math.nan), (0, 1)) == 0.0
    assert temporal_iou((0, math.inf), (0, 1)) == 0.0


def test_tvg_accuracy() -> None:
    # [10, 20] vs [15, 25]: inter 5, union 15 -> 1/3
    assert tvg_accuracy("It happens from 10 to 20 s.", "[15, 25]") == pytest.approx(1 / 3)
    assert tvg_accuracy("[10, 20]", (10.0, 20.0)) == 1.0
    assert tvg_accuracy("no interval", "[1, 2]") == 0.0
    assert tvg_accuracy("[1, 2]", "garbage gold") == 0.0


# ------------------------------------------------------------------ accuracy_reward


def test_accuracy_reward_exact_match_first() -> None:
    assert accuracy_reward("The red car", "red car", "oe") == 1.0
    # [12.5, 20] vs "12.5 - 20": both normalise to "12 5 20" -> 1 before any IoU.
    assert accuracy_reward("[12.5, 20]", "12.5 - 20", "tvg") == 1.0


def test_accuracy_reward_by_type() -> None:
    assert accuracy_reward("The answer is B", "B", "mcq") == 1.0
    assert accuracy_reward("The answer is B", "C", "MCQ ") == 0.0  # type read case-insensitively
    assert accuracy_reward("[0, 10]", "[5, 15]", "tvg") == pytest.approx(1 / 3)
    assert accuracy_reward("a red car parked", "the red car", "oe") == pytest.approx(0.8)
    assert accuracy_reward("a red car parked", "the red car", "oe", open_ended="exact") == 0.0
    assert accuracy_reward("", "", "oe") == 0.0
    assert accuracy_reward("  ", "B", "mcq") == 0.0


def test_accuracy_reward_with_judge() -> None:
    calls = []

    def judge(prediction: str, gold: str) -> float:
        calls.append((prediction, gold))
        return 0.5

    assert accuracy_reward("crimson", "red", "oe", open_ended="judge", judge=judge) == 0.5
    assert calls == [("crimson", "red")]
    # An exact match never reaches the judge.
    assert accuracy_reward("red", "red", "oe", open_ended="judge", judge=judge) == 1.0
    assert len(calls) == 1
    # A judge out of range or NaN is clamped to [0, 1] / zeroed.
    assert accuracy_reward("x", "y", "oe", open_ended="judge", judge=lambda p, g: 7.0) == 1.0
    assert accuracy_reward("x", "y", "oe", open_ended="judge", judge=lambda p, g: math.nan) == 0.0


def test_accuracy_reward_config_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="needs a judge callable"):
        accuracy_reward("x", "y", "oe", open_ended="judge")
    with pytest.raises(ValueError, match="unknown open_ended scorer 'bleu'"):
        accuracy_reward("x", "y", "oe", open_ended="bleu")
    with pytest.raises(ValueError, match=r"unknown question_type 'essay'.*mcq, tvg, oe"):
        accuracy_reward("x", "y", "essay")


# ------------------------------------------------------------------ properties

_TAGGY = st.lists(
    st.sampled_from(
        [
            "<answer>",
            "</answer>",
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "A",
            "B",
            "(",
            ")",
            ":",
            " ",
            "\n",
            "12.5",
            "-",
            "–",
            "to",
            "00:12",
            "1:02:03",
            "answer is",
            ".",
        ]
    ),
    max_size=30,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=200), _TAGGY), letters=st.text(max_size=6))
def test_extractors_never_raise(text: str, letters: str) -> None:
    letter = extract_option_letter(text, letters or "ABCD", ("red", text[:5]))
    assert letter is None or letter in (letters or "ABCD").upper()
    interval = parse_interval(text)
    if interval is not None:
        assert all(math.isfinite(v) for v in interval) and interval[0] <= interval[1]
    answer = extract_answer(text)
    assert isinstance(answer, str)
    for kind in ("mcq", "tvg", "oe"):
        value = accuracy_reward(answer, text, kind, ("red", "blue"))
        assert 0.0 <= value <= 1.0
