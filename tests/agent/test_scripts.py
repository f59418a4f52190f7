"""The scripted teacher answers each sample with its own ground truth (keyed by sample id)."""

from __future__ import annotations

import pytest

from paravt.agent.scripts import (
    DIRECT_THOUGHT,
    TOOL_THOUGHT,
    distinct_question_batches,
    needle_teacher,
    search_windows,
    teacher_plan,
)
from paravt.types import Sample


def _sample(i: int, question: str, answer: str) -> Sample:
    return Sample(id=f"s{i}", video=f"v{i}.mp4", question=question, answer=answer)


def test_samples_sharing_a_question_go_to_different_batches():
    samples = [
        _sample(0, "What colour? in the first half", "A"),
        _sample(1, "What colour? in the first half", "C"),
        _sample(2, "What colour? in the second half", "B"),
        _sample(3, "What colour? in the first half", "D"),
    ]
    batches = distinct_question_batches(samples)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    for batch in batches:
        questions = [samples[i].question for i in batch]
        assert len(set(questions)) == len(questions)
    # Within each batch the teacher answers every sample with its own answer.
    for batch in batches:
        respond = needle_teacher([samples[i] for i in batch], "search")
        for i in batch:
            context = f"<video> {samples[i].question}<tool_response> frames </tool_response>"
            assert respond(context).endswith(f"<answer>{samples[i].answer}</answer>")


def test_teacher_refuses_ambiguous_questions_instead_of_mislabelling():
    a, b = _sample(0, "Q?", "A"), _sample(1, "Q?", "B")
    with pytest.raises(ValueError, match="share a question"):
        needle_teacher([a, b])


def test_a_question_that_prefixes_another_does_not_steal_its_context():
    short = _sample(0, "What colour is the square", "A")
    long = _sample(1, "What colour is the square in the second half?", "D")
    respond = needle_teacher([short, long])
    context = f"{long.question}<tool_response>x</tool_response>"
    assert respond(context).endswith("<answer>D</answer>")


def test_generated_needle_data_teacher_targets_match_ground_truth(tmp_path):
    from paravt.video.synthetic import NeedleConfig, make_rows

    rows = make_rows(NeedleConfig(num_train=64, num_eval=0, families=(("color", 1.0),)), "train")
    samples = [
        Sample(r["id"], "", r["prompt"][0]["content"], r["extra_info"]["answer"]) for r in rows
    ]
    assert len({s.question for s in samples}) < len(samples)  # the data does share questions
    for batch in distinct_question_batches(samples):
        respond = needle_teacher([samples[i] for i in batch])
        for i in batch:
            got = respond(samples[i].question + "<tool_response>")
            assert got.endswith(f"<answer>{samples[i].answer}</answer>"), samples[i].id


def _needle(i: int, hint: tuple[float, float]) -> Sample:
    extra = {"hint_window": list(hint), "duration": 64.0}
    return Sample(f"n{i}", f"v{i}.mp4", f"Q{i} hint {hint}?", "B", extra=extra)


def test_teacher_plan_gives_exact_shares_and_each_sample_a_stable_strategy():
    ids = [f"n{i}" for i in range(10)]
    plan = teacher_plan(ids, {"search": 3, "direct": 1})  # 10 * 3/4 = 7.5 -> 8, 2.5 -> 2
    shares = [list(plan.values()).count(k) for k in ("search", "direct")]
    assert sorted(plan) == sorted(ids) and sum(shares) == 10 and shares in ([8, 2], [7, 3])
    assert teacher_plan(ids[::-1], {"search": 3, "direct": 1}) == plan  # order-free
    assert teacher_plan(ids, {"search": 1}) == dict.fromkeys(ids, "search")
    other_seed = teacher_plan(ids, {"search": 1, "direct": 1}, seed=1)
    assert other_seed != teacher_plan(ids, {"search": 1, "direct": 1}, seed=0)
    with pytest.raises(ValueError, match="strategies in"):
        teacher_plan(ids, {"guess": 1.0})


def test_unhinted_crops_the_rest_of_the_video_and_direct_crops_nothing():
    s = _needle(0, (32.0, 64.0))
    assert search_windows(s, "search") == [(32.0, 48.0), (48.0, 64.0)]
    assert search_windows(s, "unhinted") == [(0.0, 16.0), (16.0, 32.0)]
    assert search_windows(s, "direct") == []


def test_the_plan_decides_each_samples_first_turn():
    a, b = _needle(0, (0.0, 32.0)), _needle(1, (32.0, 64.0))
    respond = needle_teacher([a, b], "search", plan={"n0": "direct"})
    direct = respond(a.question)
    assert direct.startswith(DIRECT_THOUGHT) and direct.endswith("<answer>B</answer>")
    assert "<tool_call>" not in direct
    searched = respond(b.question)
    assert searched.startswith(TOOL_THOUGHT) and searched.count("<tool_call>") == 2
    assert '"start_time": 32.0' in searched and "<answer>" not in searched
    # The decision is the first token: the two thoughts differ in their first word.
    assert TOOL_THOUGHT.split()[0] != DIRECT_THOUGHT.split()[0]
    with pytest.raises(ValueError, match="unknown teacher strategy"):
        needle_teacher([a], "search", plan={"n0": "guess"})


def test_a_sequential_teacher_issues_the_same_crops_one_per_turn():
    s = _needle(0, (32.0, 64.0))
    respond = needle_teacher([s], "search", calls_per_turn=1)
    first = respond(s.question)
    assert first.count("<tool_call>") == 1 and '"start_time": 32.0' in first
    second = respond(s.question + "<tool_response>x</tool_response>")
    assert second.count("<tool_call>") == 1 and '"start_time": 48.0' in second
    done = respond(s.question + "<tool_response>x</tool_response>" * 2)
    assert done.endswith("<answer>B</answer>") and "<tool_call>" not in done
    parallel = needle_teacher([s], "search")(s.question)
    assert parallel.count("<tool_call>") == 2
