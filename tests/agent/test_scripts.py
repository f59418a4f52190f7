"""The scripted teacher answers each sample with its own ground truth (keyed by sample id)."""

from __future__ import annotations

import pytest

from paravt.agent.scripts import distinct_question_batches, needle_teacher
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
