"""`experiment=paragrpo_1p7`'s topology rehearsed on CPU (issue 50): two FSDP2 ranks under
Lightning's launcher over gloo, one rollout server that rank 0 starts, asynchronous rollouts at
staleness 2 with partial rollouts, the decoupled loss, and a held-out evaluation inside the run;
the GPU decisions forced (PARAVT_ASSUME_GPU=1) where the CPU can follow them.

Finding 1 broke this start on a GPU: rank 0's server inherited Lightning's WORLD_SIZE /
MASTER_PORT and, deciding as on a GPU, took vLLM's external launcher on the trainer's port.
"""

from __future__ import annotations

import pytest

# The run takes about 3 minutes (docs/development.md); a hang (a sender, a server, a rank left
# in a collective) fails it at RUN_LIMIT_S instead of holding the suite, and pytest's limit is
# the backstop over the fixtures' builds too.
RUN_LIMIT_S = 480
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_1p7_topology_trains_and_evaluates_on_cpu(caller_dir, needle_dir, tmp_path, train_py):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    settings = {
        "model.path": str(caller_dir),
        "model.build_tiny": "null",
        "data.train_path": str(needle_dir / "train.jsonl"),
        "data.eval_path": str(needle_dir / "eval.jsonl"),
        "data.generate": "null",
        "trainer": "fsdp_cpu",
        "rollout/engine": "vllm_server",  # no server_urls: rank 0 starts the server
        "rollout.engine.max_model_len": "4096",
        "rollout.mode": "async",
        "rollout.max_staleness": "2",
        "rollout.partial": "true",
        "algorithm.loss": "decoupled_ppo",
        "algorithm.iw_cap": "5.0",
        "cold_start": "null",
        "model.freeze_vision": "true",
        "data.batch_size": "2",
        "rollout.group_size": "2",
        "rollout.agent.max_new_tokens": "16",
        "trainer.max_steps": "2",
        "callbacks.benchmark_validation.every_n_steps": "1",
        "callbacks.benchmark_validation.limit": "2",
        "callbacks.benchmark_validation.at_start": "false",  # the recipe's baseline: not needed
        "export_hf": "false",
        "hydra.run.dir": str(tmp_path),
    }
    args = [f"{k}={v}" for k, v in settings.items()]
    proc = train_py(*args, timeout=RUN_LIMIT_S, env={"PARAVT_ASSUME_GPU": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "MEMBER: 2/2" in out
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    run = {k: [e.value for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]}
    assert run["update/trajectories"] == [4.0, 4.0]  # both ranks trained their share
    # held-out evaluations after steps 1 and 2: the first inside the run, with step 2's
    # rollouts in flight on the servers (every_n_steps 1; none at the start)
    assert [e.step for e in acc.Scalars("val/needle/accuracy")] == [1, 2]
