"""lmms-eval's rules as paravt reimplements them, on answers where they differ from the official
rules (expected values worked out by hand from lmms-eval 0.7.3's task code; the item-by-item
check against that code is tests/eval/test_lmms_eval_agreement.py)."""

from __future__ import annotations

import pytest

from paravt.eval import lmms_scoring as lmms
from paravt.eval import scoring
from paravt.eval.results import format_metrics, primary_scoring

OPTIONS = ("The man runs", "A dog sleeps", "Rain falls", "Nothing")


def test_reasoning_blocks_go_before_any_rule():
    assert lmms.strip_reasoning("<think>B is wrong</think> C") == "C"
    assert lmms.strip_reasoning("B is wrong</think>D") == "D"  # opening tag in the prompt
    assert lmms.strip_reasoning("<think>unclosed B") == "<think>unclosed B"
    assert lmms.strip_reasoning(" <analysis>x</analysis>A<think>y</think> ") == "A"


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("b", ""),  # capitals only
        ("the answer is c", ""),
        ("Rain falls", ""),  # the option's text is not read
        ("A man walks in, so the answer is C.", "A"),  # a leading capital outranks the phrase
        ("The answer is A, since B loses to A", "A"),  # the last character outranks the phrase
        ("Answer: A. Option B is wrong", "A"),  # "A." outranks "B "
        ("Answer: D) the rain", "D"),
        ("INSIDE", "D"),  # nothing else: the last capital choice letter, inside a word
        ("The answer is not B, it is A.", "A"),
        ("C or D", "C"),
        ("", ""),
    ],
)
def test_the_shared_letter_rule(answer, letter):
    assert lmms.mcq_letter(lmms.strip_reasoning(answer)) == letter


def test_the_shared_rule_and_the_official_one_differ_on_these():
    assert scoring.extract_choice("b", OPTIONS) == "B" and not lmms.mcq_correct("b", "B")
    assert scoring.extract_choice("C or D", OPTIONS) is None and lmms.mcq_correct("C or D", "C")


def test_longvideobench_takes_the_first_capital_or_guesses():
    assert lmms.longvideobench_letter("Answer: D) the cat", 4) == ("A", False)  # "Answer"
    assert lmms.longvideobench_letter("Best answer: C", 4) == ("C", False)  # prefix removed
    assert lmms.longvideobench_letter("The answer is E", 4) == ("E", False)  # not an option
    letter, guessed = lmms.longvideobench_letter("no idea", 4, key="q1")
    assert guessed and letter in "ABCD"
    assert lmms.longvideobench_letter("no idea", 4, key="q1") == (letter, True)  # seeded
    draws = {lmms.longvideobench_letter("no idea", 4, key=f"q{i}")[0] for i in range(64)}
    assert draws == set("ABCD")


def test_mmvu_credits_the_gold_letter_and_its_words_anywhere():
    choices = dict(zip("ABCD", OPTIONS, strict=True))
    # "A" inside "ANSWER" and "the" of the gold text "The man runs"
    assert lmms.mmvu_correct("The answer is D.", "A", choices)
    assert lmms.mmvu_correct("a", "A", choices)  # any case
    assert lmms.mmvu_correct("It is rain falls.", "C", choices)  # the gold text
    assert not lmms.mmvu_correct("D", "A", choices)


@pytest.mark.parametrize(
    ("answer", "iou"),
    [
        ("12.0 - 14.9", 1.0),
        ("The event happens in 12 to 14.9 seconds.", 1.0),
        ("0:12-0:14", pytest.approx(2.0 / 2.9)),
        ("[12.0, 14.9]", 0.0),
        ("(0.8, 4.7)", 0.0),
        ("between 12.0 and 14.9", 0.0),
        ("12.0~14.9", 0.0),
        ("14.9 - 12.0", 1.0),
        ("It starts at 12.0.\nIt ends at 14.9.", 1.0),  # first number of each timed sentence
        ("", 0.0),
    ],
)
def test_charades_parser(answer, iou):
    assert lmms.charades_iou(answer, (12.0, 14.9)) == iou


def test_aggregations():
    # MLVU: 7 fixed types, an absent type counts 0
    assert lmms.mlvu_m_avg(["count", "count", "ego"], [1.0, 0.0, 1.0]) == pytest.approx(1.5 / 7)
    assert lmms.mmvu_accuracy(["Biology", "Art", "Unlisted"], [1.0, 0.0, 1.0]) == 0.5
    assert lmms.longvideobench_accuracy([1.0, 0.0, 0.0]) == 0.33333
    summary = lmms.charades_summary([("v", "c"), ("v", "c"), ("w", "c")], [1.0, 0.4, 0.6])
    assert summary == {"miou": 0.5, "r@0.3": 1.0, "r@0.5": 0.5, "r@0.7": 0.0}  # last of a key


def test_primary_scoring_swaps_the_names_and_the_table_shows_both():
    metrics = {"accuracy": 0.5, "lmms_eval/accuracy": 0.25, "num_samples": 4.0}
    assert primary_scoring(metrics, "official") == metrics
    swapped = primary_scoring(metrics, "lmms_eval")
    assert swapped == {"accuracy": 0.25, "official/accuracy": 0.5, "num_samples": 4.0}
    assert format_metrics("b", metrics).splitlines()[1:3] == [
        "metric       official  lmms-eval 0.7.3",
        "accuracy     50.0      25.0",
    ]
    assert format_metrics("b", swapped).splitlines()[1:3] == [
        "metric       lmms-eval 0.7.3  official",
        "accuracy     25.0             50.0",
    ]
    with pytest.raises(ValueError, match="official, lmms_eval"):
        primary_scoring(metrics, "lmms")


def test_write_metrics_puts_the_chosen_scorer_first(write_parquet, touch, tmp_path):
    import json

    from paravt.eval.adapters import get_benchmark
    from paravt.eval.runner import write_metrics

    touch("ch/AAAAA.mp4")
    rows = [{"video": "AAAAA.mp4", "caption": "person sits.", "timestamp": [12.0, 20.0]}]
    bench = get_benchmark("charades")
    items = bench.load(write_parquet(rows), str(tmp_path / "ch"))
    score = bench.score(items[0], "[12.0, 16.0]")  # official IoU 0.5, lmms-eval's 0
    records = {items[0].sample.id: {"score": score, "num_calls": 0}}
    out = tmp_path / "out"
    out.mkdir()
    metrics = write_metrics(bench, items, records, str(out), scoring="lmms_eval")
    assert metrics["miou"] == 0.0 and metrics["official/miou"] == 0.5
    assert json.loads((out / "metrics.json").read_text())["metrics"] == metrics
    table = (out / "results.md").read_text()
    assert "| metric | lmms-eval 0.7.3 | official |" in table and "| miou | 0.0 | 50.0 |" in table
