"""Every text parser and reward function runs in linear time on hostile model output.

A sampled turn can hold anything: runs of thousands of spaces or newlines, hundreds of unclosed
`<tool_call>` openings, tags nested in themselves, one keyword repeated to the token cap. A
backtracking regex or a rescan-per-tag loop turns such a turn into a training step that stalls
for minutes (`answer` + 4,000 spaces took 149 s before the fix). Each call here gets a megabyte
(or, for the random mixtures, up to a quarter megabyte) of such text and must return within
`BOUND_S` seconds; a linear function needs well under a second, a quadratic one never finishes.
A call over the bound is interrupted by SIGALRM (the regex engine checks for signals), so a
regression fails fast instead of hanging CI.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paravt.agent.parsing import (
    parse_time,
    parse_tool_calls,
    strip_tool_blocks,
)
from paravt.eval.scoring import extract_choice
from paravt.rewards.accuracy import (
    accuracy_reward,
    extract_answer,
    extract_option_letter,
    parse_interval,
)
from paravt.rewards.format import format_reward, is_degenerate
from paravt.rewards.judge import parse_verdict

BOUND_S = 10.0  # per call; linear code needs < 1 s per megabyte even on a loaded 2-core box
# The whole file's CI bound: each test at most this long (pytest-timeout), 27 tests.
pytestmark = pytest.mark.timeout(120)
MEGABYTE = 1 << 20
OPTIONS = ("a red square", "a blue circle", "nothing", "two squares")

FUNCTIONS: dict[str, Callable[[str], object]] = {
    "extract_option_letter": lambda t: extract_option_letter(t, "ABCD", OPTIONS),
    "extract_answer": extract_answer,
    "parse_interval": parse_interval,
    # normalise + F1 of the answer as the reward reads it (a whole text is refused there)
    "accuracy_oe": lambda t: accuracy_reward(extract_answer(t), "a red square", "oe"),
    "format_reward": format_reward,
    "is_degenerate": is_degenerate,
    "parse_tool_calls": parse_tool_calls,
    "strip_tool_blocks": strip_tool_blocks,
    "parse_time": parse_time,
    "extract_choice": lambda t: extract_choice(t, OPTIONS),
    "parse_verdict": parse_verdict,
}


def _run(prefix: str, unit: str, suffix: str = "") -> Callable[[int], str]:
    """prefix + unit repeated to `size` characters + suffix: the prefix and suffix set up the
    pattern that then backtracks over the run."""
    return lambda size: prefix + unit * ((size - len(prefix) - len(suffix)) // len(unit)) + suffix


def _nested_join(size: int) -> str:
    # "</tool_</tool_...</tool_call>...call>call>": each removed tag joins its neighbours.
    layers = size // len("</tool_call>")
    return "</tool_" * layers + "</tool_call>" + "call>" * layers


HOSTILE: dict[str, Callable[[int], str]] = {
    "answer_newlines": _run("The answer", "\n"),
    "answer_is_spaces": _run("answer is", " "),
    "choose_tabs": _run("I choose", "\t "),
    "option_spaces": _run("option", " ", "x"),
    "capital_spaces": _run("so B", " ", "x"),
    "capitals_spaced": _run("", "B   "),
    "bracket_number_spaces": _run("[5", " "),
    "number_spaces": _run("5", " ", "x"),
    "digits": _run("", "1", "x"),
    "clock": _run("", "1:"),
    "dots": _run("5", "."),
    "open_parens": _run("answer", "("),
    "stars": _run("**", "*"),
    "unclosed_tool_call": _run("", "<tool_call>"),
    "unclosed_tool_code": _run("", "<tool_code>{"),
    "unclosed_think": _run("", "<think>"),
    "unclosed_answer": _run("", "<answer>"),
    "close_answer": _run("", "</answer>"),
    "nested_think": _run("", "<think><think></think>"),
    "nested_join": _nested_join,
    "repeated_keyword": _run("", "the answer is option "),
    "repeated_is_correct": _run("", "A is "),
    "interval_words": _run("", "5 to "),
    "chat_tokens": _run("", "<|im_start|>user\n"),
    "not_spaces": _run("NOT", " "),
}


class _TooSlow(Exception):
    pass


@contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    def _raise(_signum: int, _frame: object) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _assert_fast(text: str, label: str) -> None:
    for name, fn in FUNCTIONS.items():
        start = time.perf_counter()
        try:
            with _time_bound(BOUND_S):
                fn(text)
        except _TooSlow:
            pytest.fail(f"{name} took over {BOUND_S} s on {label} ({len(text)} chars)")
        assert time.perf_counter() - start < BOUND_S, (name, label)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_megabyte_hostile_text_is_parsed_in_bounded_time(case: str) -> None:
    _assert_fast(HOSTILE[case](MEGABYTE), case)


def test_known_catastrophic_inputs_give_the_right_answer_fast() -> None:
    # The reported stalls, now instant, and still read correctly.
    assert extract_option_letter("The answer is" + " " * 4000 + "B") == "B"
    assert extract_option_letter("answer" + "\n" * 2000 + ": (C)") == "C"
    assert extract_option_letter("B" + " " * 16000 + "is correct") == "B"
    assert parse_interval("[5" + " " * 4000 + ", 9]") == (5.0, 9.0)
    assert len(parse_tool_calls("<tool_call>" * 50_000)) == 50_000


# Random mixtures: several hostile runs glued together, so patterns meet each other's runs.
_FRAGMENTS = [
    *("answer", "The answer is", "option", "I choose", "so B", "B", "A is ", "[5", "5", "1:", "."),
    *(" ", "\n", "\t", "(", "*", "x", "5 to ", "NOT", "<|im_start|>", "user\n"),
    *("<tool_call>", "</tool_call>", "<tool_code>", "</tool_code>", "</tool_", "call>", "{"),
    *("<think>", "</think>", "<answer>", "</answer>"),
]
_RUNS = st.lists(
    st.tuples(st.sampled_from(_FRAGMENTS), st.integers(min_value=1, max_value=30_000)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=_RUNS)
def test_random_hostile_mixtures_are_parsed_in_bounded_time(runs: list[tuple[str, int]]) -> None:
    text = "".join(fragment * count for fragment, count in runs)[: MEGABYTE // 4]
    _assert_fast(text, f"a mixture of {len(runs)} runs")
