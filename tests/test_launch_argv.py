"""`paravt.parallel.launch.child_argv`: a rank Lightning starts runs its parent's job only."""

from __future__ import annotations

from paravt.parallel.launch import JOB_ENV, child_argv, export_job


def test_a_child_of_a_sweep_job_runs_that_job_only(monkeypatch):
    monkeypatch.delenv(JOB_ENV, raising=False)
    export_job(["seed=1", "trainer=fsdp_cpu"], "runs/multirun/x/1")
    import os

    env = {JOB_ENV: os.environ[JOB_ENV], "LOCAL_RANK": "1"}
    argv = ["train.py", "-m", "seed=0,1", "trainer=fsdp_cpu", 'hydra.run.dir="runs/train"']
    assert child_argv(argv, env) == [
        "train.py",
        "seed=1",
        "trainer=fsdp_cpu",
        'hydra.run.dir="runs/multirun/x/1"',
        "hydra.job.name=train_ddp_process_1",
        "hydra.output_subdir=null",
    ]


def test_the_process_the_user_started_keeps_its_command_line():
    assert child_argv(["train.py", "-m", "seed=0,1"], {}) is None
    assert child_argv(["train.py"], {JOB_ENV: "{}", "LOCAL_RANK": "0"}) is None
    assert child_argv(["train.py"], {"LOCAL_RANK": "3"}) is None  # torchrun: no parent job
