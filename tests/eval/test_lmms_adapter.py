"""The lmms-eval model `paravt`. Its agent runner, on the needle rows, gives the same answers and
scores as `evaluate.py` on the same rows and checkpoint; the `lmms` subclass found through
lmms-eval's plugin registry answers lmms-eval `Instance` requests with those same answers.
lmms-eval is not a paravt dependency: that test puts `.lmms-eval-ref/` (`make lmms-eval-ref`,
part of `make test`: its wheel, loguru and pytz, without dependencies) on sys.path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paravt.errors import UserError
from paravt.eval.runner import PREDICTIONS, make_benchmark
from paravt.lmms.runner import AgentRunner, Question, protocol

ROOT = Path(__file__).resolve().parents[2]
ARGS = {"frame_budget": 4, "max_new_tokens": 160, "batch_size": 2}
LIMIT = 2  # rows: the first two of the needle split, in both paths
LMMS_REF = Path(os.environ.get("PARAVT_LMMS_EVAL_REF", ROOT / ".lmms-eval-ref"))


@pytest.fixture
def lmms_eval_on_path(monkeypatch):
    """lmms-eval importable from LMMS_REF with paravt's plugin registered; its modules are
    dropped again after the test (the registry reads LMMS_EVAL_PLUGINS when first imported)."""
    if not (LMMS_REF / "lmms_eval" / "models").is_dir() or not (LMMS_REF / "pytz").is_dir():
        pytest.skip(f"lmms-eval with pytz is not installed at {LMMS_REF}: run `make lmms-eval-ref`")
    ours = ("lmms_eval", "loguru", "pytz")
    assert not [m for m in sys.modules if m.split(".")[0] in ours], "lmms-eval imported already"
    monkeypatch.syspath_prepend(str(LMMS_REF))
    monkeypatch.setenv("LMMS_EVAL_PLUGINS", "paravt.lmms")
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ours]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def caller_dir(tool_caller, tmp_path_factory):
    model, processor = tool_caller
    out = tmp_path_factory.mktemp("lmms_caller")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rows(needle_dir):
    bench = make_benchmark("needle")
    items = bench.load(str(needle_dir / "eval.jsonl"), "", limit=LIMIT)
    return bench, [i for i in items if not i.video_missing]


@pytest.fixture(scope="module")
def by_evaluate(caller_dir, needle_dir, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("lmms_eval_ref")
    overrides = [
        "benchmark=needle", f"model.path={caller_dir}", "model.build_tiny=null",
        f"benchmark.annotations={needle_dir / 'eval.jsonl'}", f"out_dir={out / 'eval'}",
        f"hydra.run.dir={out / 'hydra'}", "device=cpu", "mode=parallel",
        "protocol.frame_budget=4", "rollout.agent.max_new_tokens=160", "protocol.batch_size=2",
        f"limit={LIMIT}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "evaluate.py", *overrides], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (out / "eval" / PREDICTIONS).read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def _questions(items) -> list[Question]:
    return [Question(i.sample.id, i.sample.question, i.sample.video) for i in items]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_runner_answers_and_scores_as_evaluate_py(caller_dir, rows, by_evaluate):
    bench, items = rows
    runner = AgentRunner(str(caller_dir), "parallel", **ARGS)
    try:
        answers = runner.answer(_questions(items))
    finally:
        runner.close()
    assert len(answers) == len(items) == len(by_evaluate)
    for item, text in zip(items, answers, strict=True):
        ref = by_evaluate[item.sample.id]
        assert text == ref["answer"], item.sample.id
        assert bench.score(item, text) == ref["score"]
    assert any("<answer>" in t for t in answers)


def test_modes_are_the_papers_settings():
    par, seq, none = (protocol(m, 64, 2048, 8) for m in ("parallel", "sequential", "no_tool"))
    assert (par.agent.max_rounds, par.crop.max_calls_per_turn, par.agent.tools) == (3, 5, True)
    assert (seq.agent.max_rounds, seq.crop.max_calls_per_turn) == (3, 1)
    assert (none.agent.max_rounds, none.agent.tools) == (0, False)
    with pytest.raises(UserError, match="mode='paralel' is unknown"):
        protocol("paralel", 64, 2048, 8)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_lmms_eval_finds_the_plugin_and_answers_instances(
    caller_dir, rows, by_evaluate, lmms_eval_on_path
):
    from lmms_eval.api.instance import Instance
    from lmms_eval.models import get_model

    cls = get_model("paravt")
    args = ",".join(f"{k}={v}" for k, v in ARGS.items())
    model = cls.create_from_arg_string(f"pretrained={caller_dir},mode=parallel,{args}")
    _, items = rows
    docs = {i: {"video": item.sample.video} for i, item in enumerate(items)}
    model.task_dict = {"needle_local": {"test": docs}}
    requests = [
        Instance(
            request_type="generate_until",
            arguments=(
                item.sample.question,
                {},
                lambda doc: [doc["video"]],
                i,
                "needle_local",
                "test",
            ),
            idx=0,
            metadata={"task": "needle_local", "doc_id": i, "repeats": 1},
        )
        for i, item in enumerate(items)
    ]
    answers = model.generate_until(requests)
    assert answers == [by_evaluate[i.sample.id]["answer"] for i in items]
    with pytest.raises(NotImplementedError, match="generate_until"):
        model.loglikelihood(requests)
