"""Run identity, the model-path check, dispatch modes, and kill -9 / resume, for real.

Real tiny Qwen3-VL checkpoints, the real needle split, real subprocesses and SIGKILL."""

from __future__ import annotations

import json
import signal
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from paravt.eval.results import METRICS, PREDICTIONS, RUN_CONFIG, check_run_identity
from paravt.models.tiny import TinyModelConfig, build_tiny_model
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]
FAST = ["limit=2", "device=cpu", "protocol.frame_budget=4", "rollout.agent.max_new_tokens=4"]


def _cfg(overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("eval", overrides=overrides)


def test_second_model_with_the_same_command_gets_its_own_results(
    tiny_qwen3_dir, needle_dir, tmp_path, monkeypatch, capsys
):
    from evaluate import evaluate

    model_b = build_tiny_model(tmp_path / "model_b", TinyModelConfig("qwen3_vl", seed=1))
    monkeypatch.chdir(tmp_path)  # the default out_dir is relative to the working directory
    common = [f"benchmark.annotations={needle_dir / 'eval.jsonl'}", "mode=no_tool", *FAST]
    evaluate(_cfg([f"model.path={tiny_qwen3_dir}", *common]))
    first = capsys.readouterr().out
    evaluate(_cfg([f"model.path={model_b}", *common]))
    second = capsys.readouterr().out
    dirs = sorted(p.parent for p in tmp_path.glob(f"runs/eval/needle/no_tool/*/{RUN_CONFIG}"))
    assert len(dirs) == 2  # one out_dir per model
    models = {json.loads((d / RUN_CONFIG).read_text())["model"] for d in dirs}
    assert models == {str(tiny_qwen3_dir), str(model_b)}
    for d in dirs:  # each ran its own 2 items
        assert len((d / PREDICTIONS).read_text().splitlines()) == 2
        header = json.loads((d / METRICS).read_text())["run"]
        assert header["model"] in models and header["engine"] == "hf"
        assert "model: `" in (d / "results.md").read_text()
    assert first.split("results:")[1] != second.split("results:")[1]


def test_resuming_another_models_out_dir_is_refused(tmp_path):
    check_run_identity(str(tmp_path), {"model": "/m/a", "annotations": "/x.jsonl"})
    check_run_identity(str(tmp_path), {"model": "/m/a", "annotations": "/x.jsonl"})  # same: ok
    with pytest.raises(ValueError, match=r"model: '/m/a' then, '/m/b' now.*new out_dir"):
        check_run_identity(str(tmp_path), {"model": "/m/b", "annotations": "/x.jsonl"})
    with pytest.raises(ValueError, match=r"annotations"):
        check_run_identity(str(tmp_path), {"model": "/m/a", "annotations": "/y.jsonl"})


def test_a_missing_model_path_is_an_error_and_creates_nothing(tmp_path):
    target = tmp_path / "nonexistent"
    argv = [str(ROOT / "evaluate.py"), f"model.path={target}", f"out_dir={tmp_path / 'o'}"]
    run = forkserver.run([*argv, f"hydra.run.dir={tmp_path / 'hydra'}"], tmp_path / "logs", ROOT)
    assert run.returncode == 2
    assert str(target) in run.stderr and "Traceback" not in run.stderr
    assert not target.exists() and not (tmp_path / "o").exists()


def _evaluate_on_the_needle_split(override, model, needle_dir, tmp_path):
    """`python evaluate.py` on the tiny model and the needle split, with `override`."""
    argv = [str(ROOT / "evaluate.py"), f"model.path={model}", "model.build_tiny=null"]
    argv += [f"benchmark.annotations={needle_dir / 'eval.jsonl'}", f"out_dir={tmp_path / 'o'}"]
    argv += [f"hydra.run.dir={tmp_path / 'hydra'}", override]
    return forkserver.run(argv, tmp_path / "logs", ROOT)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("device=tpu", "device='tpu': choose auto, cpu, cuda or cuda:N"),
        ("device=cuda:x", "device='cuda:x': choose auto, cpu, cuda or cuda:N"),
        ("rollout.agent.max_rounds=-1", "max_rounds must be >= 0, got -1"),
        ("limit=abc", "limit must be an integer >= 0 or null, got 'abc'"),  # was a TypeError
        ("protocol.seed=x", "protocol.seed must be an integer >= 0, got 'x'"),
    ],
)
def test_an_unusable_value_is_one_line_and_exit_2(
    override, named, tiny_qwen3_dir, needle_dir, tmp_path
):
    """Before, a bad device was torch's RuntimeError and a bad value under a `_target_` Hydra's
    traceback; now one line naming it (`python evaluate.py --cfg job` in the hint)."""
    run = _evaluate_on_the_needle_split(override, tiny_qwen3_dir, needle_dir, tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("evaluate.py: error: ") and named in last
    assert "Traceback" not in run.stderr and "train.py" not in last


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_device_cuda_without_a_gpu_is_one_line(tiny_qwen3_dir, needle_dir, tmp_path):
    """`pick_device`'s CPU side of its CUDA check: device=cuda where none is visible."""
    run = _evaluate_on_the_needle_split("device=cuda", tiny_qwen3_dir, needle_dir, tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "evaluate.py: error: device=cuda but no CUDA GPU is visible: use device=auto or cpu"
    )


def test_mode_presets_compose_one_call_cap_and_no_tool_prompt():
    from evaluate import protocol_of

    parallel, sequential, no_tool = (
        protocol_of(_cfg([f"mode={m}"])) for m in ("parallel", "sequential", "no_tool")
    )
    assert (parallel.crop.max_calls_per_turn, parallel.agent.max_rounds) == (5, 3)
    assert (sequential.crop.max_calls_per_turn, sequential.agent.max_rounds) == (1, 3)
    assert not no_tool.agent.tools and no_tool.agent.max_rounds == 0
    assert (
        len({json.dumps(p.identity(), sort_keys=True) for p in (parallel, sequential, no_tool)})
        == 3
    )


def test_no_tool_mode_has_no_tool_in_the_prompt(tiny_qwen3_dir, needle_dir):
    from dataclasses import replace

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.data.datasets import load_samples
    from paravt.models.loading import PolicySpec, load_policy
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.hf import TransformersEngine
    from paravt.video.reader import VideoReader

    model, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    samples, _ = load_samples(str(needle_dir / "eval.jsonl"), limit=1)
    params = SamplingParams(greedy=True, max_new_tokens=4)
    prompts = {}
    for tools in (True, False):
        cfg = replace(AgentConfig(max_new_tokens=4, max_rounds=0), tools=tools)
        loop = AgentLoop(
            TransformersEngine(model.eval(), processor.tokenizer),
            ChatRenderer(processor),
            VideoReader(),
            cfg,
        )
        (traj,) = loop.run(samples, [4], 1, params)
        prompts[tools] = processor.tokenizer.decode(list(traj.token_ids[: traj.prompt_length]))
    assert "crop_video" in prompts[True] and "crop_video" not in prompts[False]
    assert "tool" not in prompts[False].split("<|im_start|>user")[0].lower()


CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from paravt.agent.prompts import FORCED_ANSWER
    from paravt.agent.loop import AgentConfig
    from paravt.agent.render import ChatRenderer
    from paravt.eval import runner
    from paravt.eval.needle import NeedleBenchmark
    from paravt.eval.protocol import EvalConfig, build_agent_loop
    from paravt.models.loading import PolicySpec, load_policy
    from paravt.rollout.engines.hf import TransformersEngine
    from paravt.video.reader import VideoReader

    model_dir, annotations, out_dir, how = sys.argv[1:5]
    if how == "kill_mid_append":  # SIGKILL after half of the second batch's bytes are on disk
        calls = []
        def append(path, records):
            calls.append(len(records))
            if sum(1 for n in calls if n) == 2:  # the second batch (one item per batch)
                data = "".join(json.dumps(r) + "\\n" for r in records)
                with open(path, "a") as handle:
                    handle.write(data[: len(data) // 2])
                    handle.flush()
                    os.fsync(handle.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            runner.__dict__["_append"](path, records)
        runner.__dict__["_append"] = runner.append_predictions
        runner.append_predictions = append
    model, processor = load_policy(PolicySpec(path=model_dir))
    cfg = EvalConfig(agent=AgentConfig(max_new_tokens=6, max_total_tokens=65536, max_rounds=0),
                     frame_budget=4, batch_size=1)
    bench = NeedleBenchmark()
    items = bench.load(annotations, "", limit=5)
    loop = build_agent_loop(TransformersEngine(model.eval(), processor.tokenizer),
                            ChatRenderer(processor), VideoReader(), cfg, FORCED_ANSWER)
    print(json.dumps(runner.run_benchmark(bench, items, loop, out_dir, cfg)))
    """
)


def _child(args):
    """CHILD in a process of its own, forked from an interpreter holding the heavy imports;
    its stdout and stderr in files beside its out_dir."""
    out_dir = Path(args[2])
    logs = [out_dir.parent / f"{out_dir.name}-{time.monotonic_ns()}.{s}" for s in ("out", "err")]
    argv = ["-c", *map(str, args)]
    return forkserver.start(CHILD, argv, logs[0], {"OMP_NUM_THREADS": "1"}, ROOT, logs[1])


def _finish(args):
    proc = _child(args)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def _ids(out_dir):
    return [json.loads(x)["id"] for x in (out_dir / PREDICTIONS).read_text().splitlines()]


def test_killed_evaluation_resumes_to_the_uninterrupted_metrics(
    tiny_qwen3_dir, needle_dir, tmp_path
):
    annotations = needle_dir / "eval.jsonl"
    reference = _finish([tiny_qwen3_dir, annotations, tmp_path / "ref", "run"])
    # 1. SIGKILL while the second batch is being appended (half its bytes written).
    killed = _child([tiny_qwen3_dir, annotations, tmp_path / "mid", "kill_mid_append"])
    killed.communicate(timeout=400)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "mid" / PREDICTIONS).read_text().endswith("\n")  # really torn
    assert _finish([tiny_qwen3_dir, annotations, tmp_path / "mid", "run"]) == reference
    # 2. SIGKILL at an arbitrary point, once the first batch is on disk.
    proc = _child([tiny_qwen3_dir, annotations, tmp_path / "any", "run"])
    deadline = time.time() + 300
    while time.time() < deadline and not (tmp_path / "any" / PREDICTIONS).is_file():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert _finish([tiny_qwen3_dir, annotations, tmp_path / "any", "run"]) == reference
    for name in ("mid", "any"):  # no duplicate, no lost prediction
        assert sorted(_ids(tmp_path / name)) == sorted(_ids(tmp_path / "ref"))


def test_row_labels_name_what_differs_between_the_jobs():
    from paravt.eval.compare import job_labels

    common = {"benchmark": "needle", "model.path": "m"}
    jobs = [
        (mode, {**common, "mode": mode, "protocol.frame_budget": k})
        for mode in ("parallel", "tools_denied")
        for k in ("2", "4")
    ]
    assert job_labels(jobs) == [
        "parallel protocol.frame_budget=2",
        "parallel protocol.frame_budget=4",
        "tools_denied protocol.frame_budget=2",
        "tools_denied protocol.frame_budget=4",
    ]
    # Only the mode varies: the labels are the modes; two models: the model path is named.
    assert job_labels([("parallel", common), ("no_tool", common)]) == ["parallel", "no_tool"]
    other = {**common, "model.path": "n"}
    assert job_labels([("parallel", common), ("parallel", other)]) == [
        "parallel model.path=m",
        "parallel model.path=n",
    ]


def test_one_command_compares_the_three_modes(tiny_qwen3_dir, needle_dir, tmp_path):
    argv = [str(ROOT / "evaluate.py"), "-m", "benchmark=needle", "mode=parallel,sequential,no_tool"]
    argv += [f"model.path={tiny_qwen3_dir}", f"benchmark.annotations={needle_dir / 'eval.jsonl'}"]
    argv += [f"hydra.sweep.dir={tmp_path / 'sweep'}", *FAST]
    run = forkserver.run(argv, tmp_path / "logs", tmp_path, timeout=500)
    assert run.returncode == 0, run.stderr[-3000:]
    table = run.stdout.split("== comparison ==")[1].strip().splitlines()
    assert table[0].startswith("| Mode | needle accuracy")
    assert [row.split("|")[1].strip() for row in table[2:5]] == [
        "parallel",
        "sequential",
        "no_tool",
    ]
    assert (tmp_path / "sweep" / "comparison.md").read_text().strip().splitlines() == table[:5]
    for mode in ("parallel", "sequential", "no_tool"):
        (metrics,) = tmp_path.glob(f"runs/eval/needle/{mode}/*/{METRICS}")
        accuracy = json.loads(metrics.read_text())["metrics"]["accuracy"]
        row = next(r for r in table if r.split("|")[1].strip() == mode)
        assert row.split("|")[2].strip() == f"{100 * accuracy:.1f}"
