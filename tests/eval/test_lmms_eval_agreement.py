"""`paravt.eval.lmms_scoring` against lmms-eval 0.7.3's own task functions, item by item.

lmms-eval is not a paravt dependency (its pins clash with paravt's): `make lmms-eval-ref` (part
of `make test`) installs its wheel and loguru, without dependencies, into `.lmms-eval-ref/`
(`PARAVT_LMMS_EVAL_REF` overrides the place); without it this module is skipped. The task
modules are loaded from that folder by file; what their scoring functions never touch is
stubbed while they load and removed after: `lmms_eval.tasks`'s registry `__init__` (it imports
datasets, transformers, ...), `lmms_eval.utils` (LongVideoBench's video path helper), `cv2` and
`datasets` (Video-MME's subtitle and filter helpers; the stub has only a `Dataset` class
for an annotation). lmms-eval's answers are computed once, in
that context, and compared with paravt's: exact agreement per item and per aggregate, except
LongVideoBench's random guesses, compared in expectation.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import sys
import types
from pathlib import Path

import pytest

from paravt.eval import lmms_scoring as lmms
from tests.eval.lmms_eval_corpus import LETTERS, interval_corpus, mcq_corpus

REF = Path(os.environ.get("PARAVT_LMMS_EVAL_REF", Path(__file__).parents[2] / ".lmms-eval-ref"))
TASKS = REF / "lmms_eval" / "tasks"
STUBS = ("cv2", "datasets", "lmms_eval.utils")

pytestmark = pytest.mark.skipif(
    not (TASKS / "_task_utils" / "mcq_extract.py").is_file(),
    reason=f"lmms-eval {lmms.LMMS_EVAL_VERSION} is not installed at {REF}: run "
    "`make lmms-eval-ref` (`make test` does)",
)


@contextlib.contextmanager
def lmms_eval_tasks():
    """{task: its utils module} loaded from REF; sys.modules and sys.path restored after."""
    saved_modules, saved_path = dict(sys.modules), list(sys.path)
    sys.path.insert(0, str(REF))
    try:
        package = types.ModuleType("lmms_eval.tasks")
        package.__path__ = [str(TASKS)]
        sys.modules["lmms_eval.tasks"] = package
        for name in STUBS:
            if name not in sys.modules and importlib.util.find_spec(name.split(".")[0]) is None:
                sys.modules[name] = types.ModuleType(name)
        # Video-MME's filter helper names datasets.Dataset in its annotations
        datasets = sys.modules.get("datasets")
        if datasets is not None and not hasattr(datasets, "Dataset"):
            datasets.Dataset = type("Dataset", (), {})
        sys.modules.setdefault("lmms_eval.utils", types.ModuleType("lmms_eval.utils"))
        modules = {}
        for task in ("videomme", "lvbench", "mlvu", "longvideobench", "mmvu", "charades_sta"):
            spec = importlib.util.spec_from_file_location(
                f"lmms_eval.tasks.{task}.utils", TASKS / task / "utils.py"
            )
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            modules[task] = module
        from lmms_eval.api.reasoning import strip_reasoning_tags

        modules["strip"] = lambda text: strip_reasoning_tags(text, lmms.REASONING_TAGS)
        yield modules
    finally:
        for name in set(sys.modules) - set(saved_modules):
            del sys.modules[name]
        sys.modules.update(saved_modules)
        sys.path[:] = saved_path


MCQ4 = mcq_corpus(4)
MCQ5 = mcq_corpus(5)
INTERVALS = interval_corpus()
VIDEOMME_CELL = {"duration": "short", "domain": "Knowledge", "sub_category": "Astronomy"}
MLVU_TYPES = ("count", "ego", "needle", "order", "plotQA")  # two dev types absent on purpose
MMVU_SUBJECTS = ("Biology", "Art", "Law", "Unlisted_Subject")  # the last is not counted
GUESS_DRAWS = 200


def _videomme(tasks, strip):
    docs = [
        {
            **VIDEOMME_CELL,
            "question_id": f"q{i}",
            "task_type": "Counting Problem",
            "answer": gold,
            "videoID": "v",
        }
        for i, (_, gold, _) in enumerate(MCQ4)
    ]
    utils = tasks["videomme"]
    rows = [
        utils.videomme_process_results(d, [strip(a)])["videomme_perception_score"]
        for d, (a, _, _) in zip(docs, MCQ4, strict=True)
    ]
    out = [r["score"] for r in rows], utils.videomme_aggregate_results(rows)
    return (*out, [r["pred_answer"] for r in rows])


def _lvbench(tasks, strip):
    utils = tasks["lvbench"]
    scores = [
        float(utils.lvbench_process_results({"answer": gold}, [strip(a)])["lvbench_score"])
        for a, gold, _ in MCQ4
    ]
    return scores, sum(scores) / len(scores), None


def _mlvu(tasks, strip):
    utils = tasks["mlvu"]
    rows = []
    for i, (a, gold, _) in enumerate(MCQ4):
        doc = {"question": f"q{i}", "task_type": MLVU_TYPES[i % 5], "answer": gold}
        rows.append(utils.mlvu_process_results(doc, [strip(a)])["mlvu_percetion_score"])
    correct = [float(r["pred_answer"] == r["answer"]) for r in rows]
    return correct, utils.mlvu_aggregate_results_dev(rows), [r["pred_answer"] for r in rows]


def _lvb_doc(i, gold, options):
    doc = {f"option{k}": text for k, text in enumerate(options)}
    doc.update({f"option{k}": "N/A" for k in range(len(options), 5)})
    doc.update(id=f"q{i}", duration_group=600, question_category="T2O")
    return {**doc, "correct_choice": LETTERS.index(gold)}


def _longvideobench(tasks, strip):
    """(letters, guessed flags, the guess accuracy over seeds) of lmms-eval's LongVideoBench."""
    utils = tasks["longvideobench"]
    letters, guessed = [], []
    for i, (a, gold, options) in enumerate(MCQ4 + MCQ5):
        # the task's guess draws from the choices it is given: sentinels reveal a guess
        guess = utils.parse_multi_choice_response(strip(a), ["<guess>"], {}) == "<guess>"
        guessed.append(guess)
        row = utils.longvideobench_process_results(_lvb_doc(i, gold, options), [strip(a)])
        letters.append(None if guess else row["lvb_acc"]["parsed_pred"])
    state = random.getstate()
    hits = []
    for seed in range(GUESS_DRAWS):
        random.seed(seed)
        for i, (a, gold, options) in enumerate(MCQ4 + MCQ5):
            if guessed[i]:
                doc = _lvb_doc(i, gold, options)
                pred = utils.longvideobench_process_results(doc, [strip(a)])["lvb_acc"]
                hits.append(pred["parsed_pred"] == gold)
    random.setstate(state)
    return letters, guessed, sum(hits) / max(1, len(hits)), utils


def _mmvu(tasks, strip):
    utils = tasks["mmvu"]
    rows = []
    for i, (a, gold, options) in enumerate(MCQ5):
        doc = {
            "id": f"q{i}",
            "question": "What happens?",
            "question_type": "multiple-choice",
            "answer": gold,
            "choices": dict(zip(LETTERS, options, strict=True)),
            "video_path": f"videos/{MMVU_SUBJECTS[i % 4]}/{i}.mp4",
        }
        rows.append(utils.mmvu_process_results(doc, [strip(a)])["accuracy"])
    return [float(r["correct"]) for r in rows], utils.mmvu_aggregate_results_val(rows) / 100


def _charades_key(i, gold):
    return f"v{i % 150}.mp4>>>person opens a door>>>{list(gold)}"  # 150: some keys repeat


def _charades(tasks, strip):
    utils = tasks["charades_sta"]
    intervals = [utils.extract_time(strip(a)) for a, _ in INTERVALS]
    ious = [
        utils._temporal_grounding_compute_metrics([{_charades_key(0, gold): strip(a)}])["mIOU"]
        for a, gold in INTERVALS
    ]
    merged = [{_charades_key(i, gold): strip(a)} for i, (a, gold) in enumerate(INTERVALS)]
    summary = utils._temporal_grounding_compute_metrics(merged)
    return intervals, [v / 100 for v in ious], summary


@pytest.fixture(scope="module")
def ref():
    with lmms_eval_tasks() as tasks:
        strip = tasks["strip"]
        answers = [a for a, _, _ in MCQ4 + MCQ5] + [a for a, _ in INTERVALS]
        out = {"stripped": [strip(a) for a in answers]}
        out["videomme"] = _videomme(tasks, strip)
        out["lvbench"] = _lvbench(tasks, strip)
        out["mlvu"] = _mlvu(tasks, strip)
        letters, guessed, guess_acc, _ = _longvideobench(tasks, strip)
        out["longvideobench"] = (letters, guessed, guess_acc)
        out["mmvu"] = _mmvu(tasks, strip)
        out["charades"] = _charades(tasks, strip)
        out["lvb_aggregate"] = tasks["longvideobench"].longvideobench_aggregate_results
        yield out


def _disagreements(ours, theirs, answers):
    return [(a, o, t) for a, o, t in zip(answers, ours, theirs, strict=True) if o != t]


def test_the_corpora_are_large_and_varied():
    assert len(MCQ4) >= 150 and len(MCQ5) >= 150 and len(INTERVALS) >= 150
    assert len({a for a, _, _ in MCQ4}) > 140 and len({a for a, _ in INTERVALS}) > 150


def test_reasoning_blocks_are_stripped_as_lmms_eval_does(ref):
    answers = [a for a, _, _ in MCQ4 + MCQ5] + [a for a, _ in INTERVALS]
    ours = [lmms.strip_reasoning(a) for a in answers]
    assert _disagreements(ours, ref["stripped"], answers) == []


@pytest.mark.parametrize("task", ["videomme", "lvbench", "mlvu"])
def test_shared_mcq_rule_agrees_per_item_and_in_aggregate(ref, task):
    theirs, aggregate, their_letters = ref[task]
    answers = [a for a, _, _ in MCQ4]
    ours = [float(lmms.mcq_correct(a, gold)) for a, gold, _ in MCQ4]
    assert _disagreements(ours, theirs, answers) == []
    if their_letters is not None:  # the letter read, not only its correctness
        letters = [lmms.mcq_letter(lmms.strip_reasoning(a)) for a in answers]
        assert _disagreements(letters, their_letters, answers) == []
    assert 0 < sum(ours) < len(ours)  # both outcomes occur
    if task == "videomme":
        assert lmms.accuracy(ours) * 100 == pytest.approx(aggregate)
    elif task == "mlvu":
        types_ = [MLVU_TYPES[i % 5] for i in range(len(MCQ4))]
        assert lmms.mlvu_m_avg(types_, ours) * 100 == pytest.approx(aggregate)
    else:
        assert lmms.accuracy(ours) == pytest.approx(aggregate)


def test_longvideobench_letters_and_guesses_agree(ref):
    letters, guessed, guess_acc = ref["longvideobench"]
    items = MCQ4 + MCQ5
    ours = [
        lmms.longvideobench_letter(a, len(opts), key=f"q{i}")
        for i, (a, _, opts) in enumerate(items)
    ]
    assert [g for _, g in ours] == guessed
    assert 0 < sum(guessed) < len(items)  # guesses and reads both occur
    read = [letter if not g else None for letter, g in ours]
    assert _disagreements(read, letters, [a for a, _, _ in items]) == []
    # in expectation: a guess is right 1/n of the time for both
    expected = sum(1 / len(opts) for (_, _, opts), g in zip(items, guessed, strict=True) if g)
    expected /= sum(guessed)
    hits = [
        lmms.longvideobench_letter(a, len(opts), key=f"{i}/{seed}")[0] == gold
        for seed in range(GUESS_DRAWS)
        for i, (a, gold, opts) in enumerate(items)
        if guessed[i]
    ]
    spread = 4 * (expected * (1 - expected) / len(hits)) ** 0.5
    assert abs(sum(hits) / len(hits) - expected) < spread
    assert abs(guess_acc - expected) < spread
    # the aggregate: the same letters give lmms-eval's figure
    rows = [
        {
            "id": f"q{i}",
            "duration_group": 600,
            "question_category": "T2O",
            "answer": gold,
            "parsed_pred": letter,
        }
        for i, ((_, gold, _), (letter, _)) in enumerate(zip(items, ours, strict=True))
    ]
    correct = [float(letter == gold) for (_, gold, _), (letter, _) in zip(items, ours, strict=True)]
    assert lmms.longvideobench_accuracy(correct) == ref["lvb_aggregate"](rows)


def test_mmvu_rule_agrees_per_item_and_in_aggregate(ref):
    theirs, aggregate = ref["mmvu"]
    ours = [
        float(lmms.mmvu_correct(a, gold, dict(zip(LETTERS, opts, strict=True))))
        for a, gold, opts in MCQ5
    ]
    assert _disagreements(ours, theirs, [a for a, _, _ in MCQ5]) == []
    assert 0 < sum(ours) < len(ours)
    subjects = [MMVU_SUBJECTS[i % 4] for i in range(len(MCQ5))]
    assert lmms.mmvu_accuracy(subjects, ours) == pytest.approx(aggregate)


def test_charades_parser_iou_and_summary_agree(ref):
    intervals, ious, summary = ref["charades"]
    answers = [a for a, _ in INTERVALS]
    ours = [[list(pair) for pair in lmms.charades_intervals(a)] for a in answers]
    assert _disagreements(ours, [[list(p) for p in found] for found in intervals], answers) == []
    our_ious = [lmms.charades_iou(a, gold) for a, gold in INTERVALS]
    # lmms-eval reports each IoU as a percentage: equal up to that scaling's rounding
    assert [
        (a, o) for a, o, t in zip(answers, our_ious, ious, strict=True) if abs(o - t) > 1e-12
    ] == []
    assert 0 < sum(v == 0 for v in our_ious) < len(our_ious)
    keys = [_charades_key(i, gold) for i, (_, gold) in enumerate(INTERVALS)]
    our_summary = lmms.charades_summary([(k,) for k in keys], our_ious)
    assert our_summary["miou"] * 100 == pytest.approx(summary["mIOU"])
    for t, name in ((0.3, "IOU@3"), (0.5, "IOU@5"), (0.7, "IOU@7")):
        assert our_summary[f"r@{t}"] * 100 == pytest.approx(summary[name])
