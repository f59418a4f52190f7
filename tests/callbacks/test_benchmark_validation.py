"""BenchmarkValidation in a real Trainer, on a real held-out .jsonl file."""

from __future__ import annotations

import json

import pytest

from paravt.callbacks.benchmark_validation import BenchmarkValidation
from paravt.data.datasets import DataFileError
from paravt.data.schemas import sample_to_row
from paravt.types import Sample

# (answer, tool calls the toy agent makes, format reward the toy scorer gives); "A" is correct
ROWS = [("A", 2, 1.0), ("B", 0, 0.5), ("A", 1, 0.0)]
KEYS = ("accuracy", "f_tau", "kappa")


@pytest.fixture
def samples_path(tmp_path):
    lines = []
    for i, (answer, calls, fmt) in enumerate(ROWS):
        video = tmp_path / f"v{i}.mp4"
        video.write_bytes(b"")  # load_samples checks that the video exists, never opens it
        sample = Sample(
            id=f"s{i}",
            video=str(video),
            question="Which colour?\nA. red\nB. green",
            answer=answer,
            options=("red", "green"),
            extra={"calls": calls, "fmt": fmt},
        )
        lines.append(json.dumps(sample_to_row(sample, tmp_path)))
    path = tmp_path / "heldout.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _logged(toy, log_dir, name):
    events = toy.read_events(log_dir)
    return {key: toy.scalars(events, f"val/{name}/{key}") for key in KEYS}


def test_evaluates_every_n_steps_and_at_the_end(tmp_path, toy, samples_path):
    callback = BenchmarkValidation(str(samples_path), every_n_steps=2, name="toy")
    trainer, module, log_dir = toy.fit(tmp_path, [callback], max_steps=3)
    # after optimizer step 2 (in the step) and after step 3 (on_train_end)
    assert [c["step"] for c in module.eval_calls] == [2, 3]
    assert all(c["ids"] == ["s0", "s1", "s2"] and c["greedy"] for c in module.eval_calls)
    # accuracy (1 + 0 + 1) / 3; f_tau (1.0 + 0.5 + 0.0) / 3 = 0.5; kappa (2 + 0 + 1) / 3 = 1
    expected = {"accuracy": 2 / 3, "f_tau": 0.5, "kappa": 1.0}
    logged = _logged(toy, log_dir, "toy")
    for key, value in expected.items():
        assert logged[key] == {2: pytest.approx(value), 3: pytest.approx(value)}
    # the in-step evaluation is also monitorable by ModelCheckpoint
    assert float(trainer.callback_metrics["val/toy/accuracy"]) == pytest.approx(2 / 3)


def test_at_start_gives_a_baseline_and_a_history(tmp_path, toy, samples_path):
    callback = BenchmarkValidation(str(samples_path), every_n_steps=2, name="toy", at_start=True)
    _, module, log_dir = toy.fit(tmp_path, [callback], max_steps=2)
    # Baseline before the first update (step 0), then after step 2.
    assert [c["step"] for c in module.eval_calls] == [0, 2]
    assert [step for step, _ in callback.history] == [0, 2]
    assert set(_logged(toy, log_dir, "toy")["accuracy"]) == {0, 2}


def test_runs_in_eval_mode_without_grad_and_restores_modes(tmp_path, toy, samples_path):
    callback = BenchmarkValidation(str(samples_path), every_n_steps=1)
    _, module, _ = toy.fit(tmp_path, [callback], max_steps=2)
    assert [c["step"] for c in module.eval_calls] == [1, 2]  # step 2 not repeated at the end
    assert not any(c["training"] or c["grad"] for c in module.eval_calls)
    assert module.seen[1]["training"]  # back in train mode for the next step
    assert not module.frozen.training  # the eval-mode submodule stays in eval mode


def test_steps_jumping_past_a_multiple_still_trigger(tmp_path, toy, samples_path):
    # 2 optimizer steps per batch: global_step 2, 4, 6 after the batches; every 3 steps fires
    # on crossing 3 (at 4) and 6 (at 6), and on_train_end does not repeat step 6.
    module = toy.Module(manual=True, steps_per_batch=2)
    callback = BenchmarkValidation(str(samples_path), every_n_steps=3)
    _, module, _ = toy.fit(tmp_path, [callback], module=module, max_steps=6)
    assert [c["step"] for c in module.eval_calls] == [4, 6]


def test_accumulated_micro_batches_trigger_once(tmp_path, toy, samples_path):
    # accumulate 2 batches per optimizer step: global_step after batches 0..3 is 0, 1, 1, 2
    callback = BenchmarkValidation(str(samples_path), every_n_steps=1)
    _, module, _ = toy.fit(tmp_path, [callback], max_steps=2, accumulate_grad_batches=2)
    assert [c["step"] for c in module.eval_calls] == [1, 2]


def test_limit_reads_only_the_first_samples(tmp_path, toy, samples_path):
    callback = BenchmarkValidation(str(samples_path), every_n_steps=1, limit=2, name="two")
    _, module, log_dir = toy.fit(tmp_path, [callback], max_steps=1)
    assert module.eval_calls[0]["ids"] == ["s0", "s1"]
    logged = _logged(toy, log_dir, "two")
    # accuracy (1 + 0) / 2; f_tau (1.0 + 0.5) / 2; kappa (2 + 0) / 2
    assert logged == {"accuracy": {1: 0.5}, "f_tau": {1: 0.75}, "kappa": {1: 1.0}}


def test_missing_file_fails_in_setup(tmp_path, toy):
    callback = BenchmarkValidation(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataFileError, match="no such file"):
        toy.fit(tmp_path, [callback])


def test_file_without_usable_samples_is_named(tmp_path, toy):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match=r"BenchmarkValidation\('needle'\): .*no usable samples"):
        toy.fit(tmp_path, [BenchmarkValidation(str(path))])


def test_module_without_the_agent_is_named(tmp_path, toy, samples_path):
    class NoAgent(toy.Module):
        evaluate_agent = None

    with pytest.raises(AttributeError, match=r"NoAgent to provide \['evaluate_agent'\]"):
        toy.fit(tmp_path, [BenchmarkValidation(str(samples_path))], module=NoAgent())


def test_agent_returning_the_wrong_count_is_named(tmp_path, toy, samples_path):
    class Short(toy.Module):
        def evaluate_agent(self, samples, greedy=True):
            return super().evaluate_agent(samples, greedy)[:-1]

    callback = BenchmarkValidation(str(samples_path), every_n_steps=1)
    with pytest.raises(ValueError, match="returned 2 trajectories for 3 samples"):
        toy.fit(tmp_path, [callback], module=Short(), max_steps=1)


def test_two_benchmarks_have_distinct_state_keys(samples_path):
    a = BenchmarkValidation(str(samples_path), name="a")
    b = BenchmarkValidation(str(samples_path), name="b")
    assert a.state_key != b.state_key


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every_n_steps": 0}, "every_n_steps must be an int"),
        ({"limit": 0}, r"limit must be None \(all samples\) or an int >= 1"),
        ({"name": "a/b"}, "without '/'"),
    ],
)
def test_rejects_bad_arguments(samples_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        BenchmarkValidation(str(samples_path), **kwargs)
