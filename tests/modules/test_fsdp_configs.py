"""The distributed trainer configs compose and instantiate; the reward-weight sweep runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def compose_cfg(overrides, hydra_cfg: bool = False):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=hydra_cfg)


def distributed(name: str, tmp_path) -> bool:
    return "strategy" in compose_cfg([f"experiment={name}", f"run_dir={tmp_path}"]).trainer


# Composed once at collection: the experiments whose trainer is distributed (FSDP2).
DISTRIBUTED = [e for e in EXPERIMENTS if distributed(e, "/tmp/paravt-compose")]


def test_some_experiments_are_distributed():
    assert {"paragrpo", "qwen2_5_vl"} <= set(DISTRIBUTED)
    assert "demo" not in DISTRIBUTED  # the embedded default runs in one process


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_distributed_experiments_instantiate_their_trainer(name, tmp_path):
    from lightning.pytorch.strategies import ModelParallelStrategy

    cfg = compose_cfg([f"experiment={name}", f"run_dir={tmp_path}"])
    assert cfg.trainer.use_distributed_sampler is False
    assert isinstance(instantiate(cfg.trainer.strategy), ModelParallelStrategy)
    # Its CPU twin (same strategy, 2 gloo processes) builds a whole Trainer here; the devices
    # are set again since an experiment may set its own (experiment=paragrpo_1p7: 7).
    twin = ["trainer=fsdp_cpu", "trainer.devices=2"]
    cpu = compose_cfg([f"experiment={name}", f"run_dir={tmp_path}", *twin])
    trainer = instantiate(cpu.trainer, logger=False, enable_checkpointing=False)
    assert isinstance(trainer.strategy, ModelParallelStrategy)
    assert trainer.num_devices == 2 and type(trainer.accelerator).__name__ == "CPUAccelerator"
    assert trainer.strategy._process_group_backend == "gloo"
    assert trainer.strategy._data_parallel_size == 2  # follows trainer.devices


def test_fsdp_gpu_recipe_values(tmp_path):
    cfg = compose_cfg(["trainer=fsdp", f"run_dir={tmp_path}"])
    assert (cfg.trainer.devices, cfg.trainer.precision, cfg.trainer.accelerator) == (
        8,
        "32-true",  # fp32 master weights; bf16 compute is FSDP2's policy
        "gpu",
    )


def test_sweep_config_sweeps_reward_weights_scored_by_held_out_accuracy(tmp_path):
    cfg = compose_cfg(["hparams_search=reward_weights", f"run_dir={tmp_path}"], hydra_cfg=True)
    assert cfg.optimized_metric == "val/needle/accuracy"
    assert dict(cfg.hydra.sweeper.params) == {
        "reward.format_weight": "0.5,1.0",
        "reward.tool_weight": "0.5,1.0",
    }
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"


@pytest.mark.slow
def test_multirun_with_the_sweep_config_returns_the_metric(train_py, tmp_path, tiny_run_overrides):
    out = train_py(
        "hparams_search=reward_weights",
        "reward.tool_weight=1.0",  # the command line narrows the 2x2 grid to 2 jobs
        "trainer.max_steps=1",
        "cold_start=null",
        "export_hf=false",
        f"hydra.sweep.dir={tmp_path}",
        *tiny_run_overrides,
        "rollout.agent.max_rounds=1",
        "rollout.agent.max_new_tokens=8",
        "callbacks.benchmark_validation.limit=1",
        "trainer.enable_progress_bar=false",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("optimized_metric")]
    assert len(lines) == 2, out.stdout[-2000:]
    for line in lines:
        name, value = line.removeprefix("optimized_metric ").split(" = ")
        assert name == "val/needle/accuracy"
        assert 0.0 <= float(value.split()[0]) <= 1.0  # one held-out sample: 0 or 1
    jobs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit())
    assert jobs == ["0", "1"]


def test_data_parallel_size_is_devices_times_nodes(tmp_path):
    cfg = compose_cfg(["experiment=paragrpo", f"run_dir={tmp_path}", "trainer.num_nodes=2"])
    strategy = instantiate(cfg.trainer.strategy)
    assert strategy._data_parallel_size == 16 and strategy._tensor_parallel_size == 1
