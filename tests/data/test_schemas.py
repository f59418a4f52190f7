"""Row -> Sample conversion for both layouts, the errors for malformed rows, and the inverse."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest

from paravt.data.schemas import (
    DataRowError,
    detect_layout,
    infer_question_type,
    parse_interval,
    row_to_sample,
    sample_to_row,
)
from paravt.types import Sample

BASE = "/data/needle"
QUESTION = "What colour is the square?\nOptions:\nA. red\nB. green\nC. blue\nD. yellow"


def paravt_row() -> dict:
    return {
        "id": "needle-train-00000",
        "data_source": "needle",
        "prompt": [{"role": "user", "content": f"<video>\n{QUESTION}"}],
        "videos": [{"video": "videos/needle-train-00000.mp4"}],
        "extra_info": {
            "answer": "B",
            "question_type": "mcq",
            "options": ["red", "green", "blue", "yellow"],
            "windows": [[12.0, 15.0]],
            "family": "color",
            "hint": "in the first half",
        },
    }


def verl_row(ground_truth, question: str = QUESTION, **extra_info) -> dict:
    return {
        "data_source": "longvt",
        "prompt": [{"role": "user", "content": f"<video>\n{question}"}],
        "videos": [{"video": "/abs/clip.mp4"}],
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {"index": 7, **extra_info},
    }


def convert(row: dict, **kwargs) -> Sample:
    return row_to_sample(row, base_dir=kwargs.pop("base_dir", BASE), row_index=0, **kwargs)


def test_paravt_row_becomes_the_expected_sample():
    sample = convert(paravt_row())
    assert sample == Sample(
        id="needle-train-00000",
        video="/data/needle/videos/needle-train-00000.mp4",
        question=QUESTION,  # the "<video>\n" prefix removed
        answer="B",
        question_type="mcq",
        options=("red", "green", "blue", "yellow"),
        windows=((12.0, 15.0),),
        data_source="needle",
        extra={"family": "color", "hint": "in the first half"},
    )
    assert detect_layout(paravt_row()) == "paravt"


def test_absolute_video_kept_and_relative_normalised():
    row = paravt_row()
    row["videos"] = [{"video": "/elsewhere/v.mp4"}]
    assert convert(row).video == "/elsewhere/v.mp4"
    row["videos"] = [{"video": "../shared/v.mp4"}]
    assert convert(row).video == "/data/shared/v.mp4"  # /data/needle/../shared
    assert convert(row, base_dir=None).video == "../shared/v.mp4"


def test_content_parts_and_system_message():
    row = paravt_row()
    row["prompt"] = [
        {"role": "system", "content": "You are a video agent."},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]},
    ]
    sample = convert(row)
    assert sample.question == QUESTION
    assert sample.extra["system_prompt"] == "You are a video agent."


def test_content_parts_with_parquet_style_none_fields():
    # parquet unifies struct fields, so a video part comes back with text=None
    row = paravt_row()
    row["prompt"] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Watch", "video": None},
                {"type": "video_url", "text": None, "video": "x"},
                {"type": "text", "text": "then answer.", "video": None},
            ],
        }
    ]
    assert convert(row).question == "Watch\nthen answer."  # the marker's own line is dropped


def test_marker_mid_sentence_leaves_one_space():
    row = paravt_row()
    row["prompt"] = [{"role": "user", "content": "Watch <video> and answer: A. x\nB. y"}]
    assert convert(row).question == "Watch and answer: A. x\nB. y"


def test_none_fields_count_as_absent():
    row = paravt_row()
    row["extra_info"].update(options=None, windows=None, hint=None)
    sample = convert(row)
    # options fall back to the question's option lines; hint=None is not kept in extra
    assert sample.options == ("red", "green", "blue", "yellow")
    assert sample.windows == ()
    assert sample.extra == {"family": "color"}


@pytest.mark.parametrize(
    ("extra_info", "source", "expected"),
    [({"index": 42}, "needle", "needle-42"), ({}, "needle", "needle-3"), ({}, "", "row-3")],
)
def test_missing_id_falls_back_to_index_then_row_number(extra_info, source, expected):
    row = paravt_row()
    del row["id"]
    row["data_source"] = source
    row["extra_info"].update(extra_info)
    assert row_to_sample(row, base_dir=BASE, row_index=3).id == expected


def test_verl_mcq_inferred_from_letter_and_option_lines():
    row = verl_row("C")
    assert detect_layout(row) == "verl"
    sample = convert(row)
    assert (sample.id, sample.answer, sample.question_type) == ("longvt-7", "C", "mcq")
    assert sample.options == ("red", "green", "blue", "yellow")  # parsed from the question
    assert sample.extra == {"index": 7, "reward_style": "rule"}


@pytest.mark.parametrize("gold", ["[3.5, 8.0]", [3.5, 8], "3.5-8"])
def test_verl_tvg_inferred_and_gold_becomes_window(gold):
    sample = convert(verl_row(gold, question="When does the dog jump?"))
    assert sample.question_type == "tvg"
    assert sample.windows == ((3.5, 8.0),)
    if not isinstance(gold, str):
        assert sample.answer == "[3.5, 8.0]"  # a pair is printed as floats


@pytest.mark.parametrize(
    ("gold", "question", "expected"),
    [
        ("a red ball", "What is thrown?", "oe"),
        ("A", "Which is first?", "oe"),  # a letter but the question lists no options
        ("E", QUESTION, "oe"),  # E is not among the listed A-D
        ("b", QUESTION, "oe"),  # only upper-case letters are option letters
        ("B", QUESTION, "mcq"),
        ("[8, 3]", "When?", "oe"),  # start > end: not an interval
        (" 12 to 15 ", "When?", "tvg"),
    ],
)
def test_infer_question_type(gold, question, expected):
    assert infer_question_type(gold, question) == expected


def test_parse_interval():
    assert parse_interval("(1.5, 2)") == (1.5, 2.0)
    assert parse_interval("12 - 15") == (12.0, 15.0)
    assert parse_interval("15, 15") is None  # empty interval
    assert parse_interval("around 12") is None


def test_verl_explicit_answer_and_type_win():
    sample = convert(verl_row("B", answer="a dog", question_type="oe"))
    assert (sample.answer, sample.question_type) == ("a dog", "oe")
    assert sample.options == ()  # not mcq: options are not parsed from the question
    assert convert(verl_row(3)).answer == "3"  # a numeric gold is printed


def _drop(key):
    def mutate(row):
        del row[key]

    return mutate


def _set(path, value):
    def mutate(row):
        target = row
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


MALFORMED = {
    "missing prompt": (_drop("prompt"), "'prompt'", "non-empty list"),
    "empty prompt": (_set(["prompt"], []), "'prompt'", "non-empty list"),
    "no user text": (
        _set(["prompt"], [{"role": "user", "content": "<video>\n"}]),
        "'prompt'",
        "no user text",
    ),
    "bad role": (_set(["prompt"], [{"role": "robot", "content": "hi"}]), "prompt[0].role", "role"),
    "bad content": (_set(["prompt", 0, "content"], 5), "prompt[0].content", "string or a list"),
    "image part": (
        _set(["prompt", 0, "content"], [{"type": "image"}]),
        "prompt[0].content[0].type",
        "'image'",
    ),
    "no videos": (_drop("videos"), "'videos'", "no video"),
    "empty videos": (_set(["videos"], []), "'videos'", "no video"),
    "two videos": (
        _set(["videos"], [{"video": "a.mp4"}, {"video": "b.mp4"}]),
        "'videos'",
        "exactly one video",
    ),
    "video not str": (_set(["videos"], [{"video": None}]), "videos[0].video", "path string"),
    "unknown type": (
        _set(["extra_info", "question_type"], "yesno"),
        "extra_info.question_type",
        "unknown question_type 'yesno'",
    ),
    "missing type": (
        _set(["extra_info", "question_type"], None),
        "extra_info.question_type",
        "missing",
    ),
    "answer missing": (_set(["extra_info", "answer"], None), "extra_info.answer", "answer missing"),
    "answer blank": (_set(["extra_info", "answer"], "  "), "extra_info.answer", "answer missing"),
    "mcq letter out of range": (_set(["extra_info", "answer"], "E"), "'answer'", "one of ABCD"),
    "options not a list": (
        _set(["extra_info", "options"], "red,green"),
        "extra_info.options",
        "options not a list",
    ),
    "option not str": (
        _set(["extra_info", "options"], ["red", {"x": 1}]),
        "extra_info.options",
        "string",
    ),
    "windows not a list": (
        _set(["extra_info", "windows"], "12-15"),
        "extra_info.windows",
        "windows malformed",
    ),
    "window reversed": (
        _set(["extra_info", "windows"], [[0, 1], [15.0, 12.0]]),
        "extra_info.windows[1]",
        "0 <= start < end",
    ),
    "window short": (
        _set(["extra_info", "windows"], [[12.0]]),
        "extra_info.windows[0]",
        "windows malformed",
    ),
    "window bool": (
        _set(["extra_info", "windows"], [[True, 2]]),
        "extra_info.windows[0]",
        "windows malformed",
    ),
    "extra_info not dict": (_set(["extra_info"], ["B"]), "'extra_info'", "expected a dict"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_row_names_row_and_field(case):
    mutate, field, reason = MALFORMED[case]
    row = copy.deepcopy(paravt_row())
    mutate(row)
    with pytest.raises(DataRowError) as info:
        convert(row)
    message = str(info.value)
    assert info.value.row_id == "needle-train-00000"
    assert message.startswith("row 'needle-train-00000': field ")
    assert field in message and reason in message


def test_verl_without_any_answer_names_ground_truth():
    row = verl_row(None)
    with pytest.raises(DataRowError, match=r"'longvt-7'.*reward_model\.ground_truth"):
        convert(row)


def test_unknown_layout_and_non_dict_row():
    with pytest.raises(DataRowError, match="unknown layout 'sft'"):
        convert(paravt_row(), layout="sft")
    with pytest.raises(DataRowError, match=r"row 'row 4'.*expected a dict"):
        row_to_sample(["not", "a", "row"], base_dir=BASE, row_index=4)  # type: ignore[arg-type]


def test_forced_paravt_layout_on_a_verl_row_requires_extra_info_answer():
    with pytest.raises(DataRowError, match=r"extra_info\.answer"):
        convert(verl_row("C"), layout="paravt")


def test_round_trip_with_relative_video(tmp_path):
    row = paravt_row()
    row["prompt"].insert(0, {"role": "system", "content": "Be brief."})
    sample = convert(row, base_dir=str(tmp_path))
    back = sample_to_row(sample, base_dir=tmp_path)
    assert back["videos"] == [{"video": os.path.join("videos", "needle-train-00000.mp4")}]
    assert back["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert row_to_sample(back, base_dir=tmp_path, row_index=99) == sample


def test_round_trip_verl_sample_and_outside_video():
    sample = convert(verl_row([3.5, 8], question="When does the dog jump?"))
    back = sample_to_row(sample, base_dir="/data/needle")
    assert back["videos"] == [{"video": "/abs/clip.mp4"}]  # outside base_dir: kept absolute
    assert detect_layout(back) == "paravt"
    assert row_to_sample(back, base_dir="/data/needle", row_index=0) == sample


def test_round_trip_without_base_dir_keeps_path():
    sample = Sample(id="s", video="v.mp4", question="Q?", answer="yes", question_type="oe")
    back = sample_to_row(sample)
    assert back["extra_info"] == {
        "answer": "yes",
        "question_type": "oe",
        "options": [],
        "windows": [],
    }
    assert row_to_sample(back, base_dir=None, row_index=0) == sample


def test_schemas_is_pure():
    code = "import sys, paravt.data.schemas; print(sorted({'torch', 'pyarrow'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
