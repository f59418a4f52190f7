"""`paravt check-recipe`: train.py's config checked against devices x nodes, with a memory plan.

Every GPU command of the README must pass (exit 0, a plan from the published model sizes);
configs that cannot run exit 2 naming the fix; the plan's parameter arithmetic is checked
against the models' published non-embedding counts and a real (tiny) model.
"""

from __future__ import annotations

import re
import shlex
from importlib.util import find_spec
from pathlib import Path

import pytest

from paravt.run.memory_plan import PUBLISHED, from_config_json
from paravt.run.recipe import main

ROOT = Path(__file__).resolve().parents[1]
GPU_MARKERS = ("trainer.devices", "experiment=paragrpo", "experiment=qwen2_5_vl ")


def readme_gpu_commands() -> list[list[str]]:
    """The `python train.py ...` commands of the README that run on GPUs."""
    text = (ROOT / "README.md").read_text()
    out = []
    for cmd in re.findall(r"python train\.py [^`\n]*", text):
        if any(m in cmd + " " for m in GPU_MARKERS):
            out.append(shlex.split(cmd)[2:])
    return out


COMMANDS = readme_gpu_commands()


def test_the_readme_has_gpu_commands():
    assert any("trainer.devices=8" in c for cmd in COMMANDS for c in cmd)


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_every_readme_gpu_command_passes_with_a_memory_plan(args, capsys):
    assert main(args) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "memory plan per GPU" in out and "recipe OK" in out
    assert ("Qwen3-VL-8B" in out) or ("Qwen2.5-VL-7B" in out)


def test_paper_command_plan_fits_80gb(capsys):
    args = ["experiment=paragrpo", "trainer.devices=8", "model.path=/m/Qwen3-VL-8B-Instruct"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "W = 8 ranks, 1 prompt(s) x 8 rollouts per rank" in out
    assert "1 rank(s) get none" in out


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (["rollout/engine=vllm", "rollout.engine.max_model_len=8192"], "max_model_len=32768"),
        (["rollout/engine=vllm", "rollout.engine.tensor_parallel_size=2"], "tensor_parallel"),
        (["trainer.precision=bf16-true"], "trainer.precision=32-true"),
        (["model.gradient_checkpointing=false"], "model.gradient_checkpointing=true"),
        (["cold_start={}"], "cold_start=null"),
    ],
)
def test_configs_that_cannot_run_exit_2_naming_the_fix(overrides, fix, capsys):
    base = ["experiment=paragrpo", "trainer.devices=8", "model.path=/m/Qwen3-VL-8B-Instruct"]
    assert main([*base, *overrides]) == 2
    out = capsys.readouterr().out
    assert "ERROR:" in out and fix in out


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("rollout.group_size=0", "rollout.group_size must be an integer >= 1, got 0"),
        ("rollout.temperature=0", "rollout.temperature must be a finite number > 0"),
        ("+model.pathh=/m", "pathh"),
        ("model.dtype=foo", "model.dtype='foo'"),  # before: a traceback from the memory plan
        ("rollout.engine.dtype=foo", "rollout.engine.dtype='foo'"),
    ],
)
def test_values_train_py_refuses_are_errors_here_too(override, named, capsys):
    """check-recipe said "recipe OK" to what train.py refuses at start (its light groups)."""
    base = ["experiment=paragrpo", "trainer.devices=8", "model.path=/m/Qwen3-VL-8B-Instruct"]
    assert main([*base, override]) == 2
    errors = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and named in errors[0]


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["data.frame_budgets=[]"], "did you mean 'cold_start.frame_budgets'"),
        (["experiment=nope"], "available: demo"),
        (["model.path"], "Error parsing override 'model.path'"),
    ],
)
def test_overrides_hydra_refuses_are_one_error_line_and_hints(overrides, said, capsys):
    assert main(overrides) == 2
    err = capsys.readouterr().err
    assert err.startswith("paravt check-recipe: error: ") and said in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (["model.lora.rank=16", "model.lora.load_in_4bit=true"], "model.lora.load_in_4bit=false"),
        (["optimizer=adamw8bit"], "optimizer=adamw (torch AdamW"),
    ],
)
def test_gpu_libraries_that_fail_under_fsdp_exit_2_naming_the_fix(overrides, fix, capsys):
    base = ["experiment=paragrpo", "trainer.devices=8", "model.path=/m/Qwen3-VL-8B-Instruct"]
    assert main([*base, *overrides]) == 2
    out = capsys.readouterr().out
    assert "under FSDP" in out and fix in out
    # on one GPU without FSDP both run (bitsandbytes' own kernels, no DTensor)
    one = ["experiment=paragrpo", "trainer.devices=1", "~trainer.strategy"]
    one += ["model.path=/m/Qwen3-VL-8B-Instruct", "--gpu-gb", "1000"]
    assert main([*one, *overrides]) == 0, capsys.readouterr().out


def test_async_rollouts_with_the_in_process_vllm_engine_on_gpus_exit_2(capsys):
    """Issue 50, finding 3: rank 0's GPU cannot hold two vLLM engines and a second policy copy
    beside the trainer; the recipe printed `recipe OK`."""
    args = ["experiment=paragrpo", "trainer.devices=8", "model.path=/m/Qwen3-VL-8B-Instruct"]
    args += ["rollout/engine=vllm", "rollout.engine.max_model_len=32768"]
    assert main(args) == 0, capsys.readouterr().out  # sync: one engine per rank
    capsys.readouterr()
    for mode in ("async", "stream"):  # stream mode's generator is async mode's
        assert main([*args, f"rollout.mode={mode}", "rollout.max_staleness=1"]) == 2
        out = capsys.readouterr().out
        assert f"rollout.mode={mode} with rollout/engine=vllm on GPUs" in out
        assert "fix: rollout/engine=vllm_server" in out


def test_a_tensor_parallel_engine_in_the_trainers_process_exits_2(capsys):
    args = ["experiment=paragrpo", "trainer.devices=1", "~trainer.strategy", "--gpu-gb", "1000"]
    args += ["model.path=/m/Qwen3-VL-8B-Instruct", "rollout/engine=vllm"]
    args += ["rollout.engine.max_model_len=32768"]
    assert main(args) == 0, capsys.readouterr().out
    assert main([*args, "rollout.engine.tensor_parallel_size=2"]) == 2
    out = capsys.readouterr().out
    assert "cannot be pickled" in out and "rollout.engine.tensor_parallel_size=1" in out


def test_the_memory_fix_names_8bit_adamw_only_without_fsdp(capsys):
    big = ["experiment=paragrpo", "model.path=/m/Qwen3-VL-8B-Instruct", "--gpu-gb", "20"]
    assert main([*big, "trainer.devices=8"]) == 2
    out = capsys.readouterr().out
    assert "more than a 20 GB GPU" in out and "adamw8bit" not in out
    assert main([*big, "trainer.devices=1", "~trainer.strategy"]) == 2
    assert "optimizer=adamw8bit" in capsys.readouterr().out


def test_required_files_are_checked(tmp_path, capsys):
    args = ["experiment=paragrpo", f"model.path={tmp_path}/Qwen3-VL-8B", "--require-files"]
    assert main(args) == 2
    assert "data.train_path names" in capsys.readouterr().out


def test_sweep_checks_every_job(capsys):
    args = ["-m", "experiment=paragrpo", "model.path=/m/Qwen3-VL-8B", "trainer.devices=4,8"]
    assert main(args) == 2  # on 4 GPUs each rank generates 2 prompts x 8 rollouts of 32k tokens
    out = capsys.readouterr().out
    assert "world size: 4" in out and "world size: 8" in out
    assert out.count("recipe OK") == 1 and "more than a 80 GB GPU" in out


def test_num_nodes_multiply_the_world(capsys):
    args = ["experiment=paragrpo", "trainer.devices=8", "trainer.num_nodes=2"]
    assert main([*args, "model.path=/m/Qwen3-VL-8B"]) == 0
    assert "world size: 16" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "non_embedding"), [("qwen3_vl_8b", 6.95e9), ("qwen2_5_vl_7b", 6.53e9)]
)
def test_layer_arithmetic_matches_the_published_non_embedding_counts(name, non_embedding):
    # Qwen3-8B / Qwen2.5-7B model cards: 6.95B / 6.53B non-embedding parameters (their
    # language models are the VL models' decoders; norms and biases are below 0.1 %).
    size = PUBLISHED[name]
    assert size.layers * size.layer_params == pytest.approx(non_embedding, rel=0.01)


def test_config_json_sizes_match_a_real_model(tiny_qwen3_dir):
    from transformers import AutoModelForImageTextToText

    size = from_config_json(Path(tiny_qwen3_dir))
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)
    lm = model.model.language_model
    real = sum(p.numel() for n, p in lm.named_parameters() if "norm" not in n)
    assert size.lm_params == real + model.lm_head.weight.numel()


def test_the_console_script_dispatches_check_recipe(capsys):
    from paravt.cli import main as paravt

    assert paravt(["check-recipe", "experiment=paragrpo", "model.path=/m/Qwen3-VL-8B"]) == 0
    assert "recipe OK" in capsys.readouterr().out


@pytest.mark.skipif(find_spec("vllm") is not None, reason="vLLM is installed in this Python")
def test_without_vllm_the_recipe_is_planned_but_train_py_refuses_naming_the_install(
    train_py, tmp_path, capsys
):
    args = ["experiment=paragrpo", "trainer.devices=8", "model.path=/m/Qwen3-VL-8B-Instruct"]
    assert main(args) == 0  # planned from any machine: vLLM is needed to run it, not to plan it
    out = capsys.readouterr().out
    assert "engine vllm" in out and "recipe OK" in out
    assert "note: to run it here: rollout/engine=vllm" in out and "pip install -e '.[vllm]'" in out
    result = train_py(f"hydra.run.dir={tmp_path / 'run'}", *args, cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if "needs vLLM" in ln]
    assert len(lines) == 1 and "pip install -e '.[vllm]'" in lines[0], result.stderr


@pytest.mark.parametrize(("dtype", "label"), [("bfloat16", "bf16"), ("float32", "fp32")])
def test_the_plans_engine_copy_is_the_measured_copy_of_the_tiny_model(dtype, label, tiny_qwen3_dir):
    """The transformers engine's copy under FSDP2 (fp32 master weights, `model.dtype` load):
    its parameter bytes, measured, are the plan's figure to the byte (vision tower included)."""
    from paravt.models.loading import PolicySpec, load_policy
    from paravt.parallel.fsdp import fp32_master
    from paravt.rollout.engine import EngineConfig
    from paravt.rollout.factory import engine_copy
    from paravt.run.memory_plan import plan
    from paravt.run.recipe_memory import plan_inputs
    from paravt.run.recipe_problems import compose

    path = f"model.path={tiny_qwen3_dir}"
    cfg = compose(["experiment=paragrpo", "rollout/engine=hf", path, f"model.dtype={dtype}"])
    figure = plan(from_config_json(Path(tiny_qwen3_dir)), plan_inputs(cfg, 80.0))
    master = fp32_master(load_policy(PolicySpec(path=str(tiny_qwen3_dir), dtype=dtype))[0])
    copy = engine_copy(master, EngineConfig())  # rollout.engine.dtype: auto
    measured = sum(p.numel() * p.element_size() for p in copy.parameters())
    assert figure[f"engine weights {label} (own full copy)"] == measured


# ---- generation servers apart from the trainer (experiment=paragrpo_1p7) -------------------
ONE_PLUS_SEVEN = ["experiment=paragrpo_1p7", "model.path=/m/Qwen3-VL-8B-Instruct"]


def test_the_1p7_topology_passes_with_a_plan_for_each_role(capsys):
    assert main(ONE_PLUS_SEVEN) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "W = 7 ranks, 1 prompt(s) x 8 rollouts per rank" in out  # 7 prompts, one a rank
    assert "rank(s) get none" not in out
    assert "trainer on GPUs 0-6 of each of 1 node(s)" in out
    assert "1 server(s) paravt starts on GPU(s) [7]" in out
    trainer, server = out.split("memory plan per generation-server GPU")
    assert "engine weights" not in trainer and "KV cache" not in trainer  # no engine on 0-6
    assert "up to 64 sequences at once, 32768 tokens each (bf16)" in server
    assert "holds 11 full-length trajectories at once" in server  # 54.5 GB / 4.83 GB
    assert "7 trainer ranks share the servers rank 0 starts" in trainer
    assert "rank 0's generator process samples every step's whole batch" in trainer
    assert "not verified on GPUs (NCCL)" in trainer


def test_sync_ranks_are_told_each_generates_its_share_on_the_servers(capsys):
    assert main([*ONE_PLUS_SEVEN, "rollout.mode=sync", "rollout.max_staleness=0"]) == 0
    out = capsys.readouterr().out
    assert "each rank generates its own share of the groups on them" in out
    assert "rank 0 writes one checkpoint and reloads each server once" in out


@pytest.mark.parametrize(
    ("overrides", "errors"),
    [
        # a trainer rank on the server's GPU, and 9 GPUs asked of an 8-GPU node
        (
            ["trainer.devices=8"],
            ["GPU(s) [7] would hold both", "trainer.devices=7 (GPUs 0-6)", "need 9 GPUs"],
        ),
        (["rollout.engine.devices=[0]"], ["GPU(s) [0] would hold", "engine.devices=[7]"]),
        (["trainer.devices=[1,2,3,4,5,6,7]"], ["GPU(s) [7] would hold", "engine.devices=[0]"]),
        (["rollout.engine.devices=[7,7]"], ["names GPU(s) [7] twice", "need 9 GPUs"]),
        (["rollout.engine.num_servers=2"], ["names 1 GPU(s) for", "engine.devices=[7, 8]"]),
        (["rollout.engine.num_servers=0"], ["nothing would generate"]),
        (["rollout.engine.devices=[8]"], ["GPU id(s) [8] do not exist on a node of 8 GPUs"]),
        (["rollout.engine.gpu_memory_utilization=0.25"], ["vLLM refuses to start"]),
    ],
)
def test_devices_that_do_not_add_up_exit_2_naming_the_fix(overrides, errors, capsys):
    assert main([*ONE_PLUS_SEVEN, *overrides]) == 2
    out = capsys.readouterr().out
    for error in errors:
        assert error in out, out
    assert "fix:" in out


def test_train_py_runs_the_device_checks_but_not_the_nodes_gpu_count():
    """`problems` is what train.py checks at start-up; the GPU count is check-recipe's flag."""
    from paravt.run.recipe_problems import compose, problems

    found = [str(p) for p in problems(compose([*ONE_PLUS_SEVEN[:1], "trainer.devices=8"]))]
    assert len(found) == 1 and "GPU(s) [7] would hold both a trainer rank" in found[0]


def test_the_nodes_gpu_count_is_a_flag(capsys):
    # a 9th GPU for the server exists only on a node that has one
    assert main([*ONE_PLUS_SEVEN, "rollout.engine.devices=[8]", "--gpus-per-node", "9"]) == 0
    assert main([*ONE_PLUS_SEVEN, "--gpus-per-node", "4"]) == 2
    assert "need 8 GPUs on a node of 4" in capsys.readouterr().out


def test_running_servers_take_no_gpu_of_the_trainers_node(capsys):
    # given as URLs, the servers are elsewhere: all 8 GPUs train, devices are not read
    urls = "rollout.engine.server_urls=[http://gen0:8000,http://gen0:8001]"
    assert main([*ONE_PLUS_SEVEN, "trainer.devices=8", urls]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "rollouts on 2 running server(s) at rollout.engine.server_urls" in out
    assert "memory plan per generation-server GPU" in out


def test_a_multi_node_run_with_servers_paravt_starts_is_told_to_name_them(capsys):
    assert main([*ONE_PLUS_SEVEN, "trainer.num_nodes=2"]) == 0
    assert "note: trainer.num_nodes=2 with servers paravt starts" in capsys.readouterr().out


def test_on_a_cpu_the_servers_need_no_gpu_ids():
    """The CPU demo with rollout/engine=vllm_server: servers share the machine's cores."""
    from paravt.run.recipe_problems import compose, device_count_problems, problems

    cfg = compose(["rollout/engine=vllm_server", "rollout.engine.devices=[0]"])
    assert cfg.trainer.accelerator == "cpu"
    assert problems(cfg) == [] and device_count_problems(cfg, 1) == []


def test_a_trainer_devices_list_counts_its_gpus(capsys):
    # a list of GPU ids is as many ranks as ids (planned as 1 rank before: 194 GiB, exit 2)
    ids = "trainer.devices=[0,1,2,3,4,5,6,7]"
    assert main(["experiment=paragrpo", "model.path=/m/Qwen3-VL-8B", ids]) == 0
    assert "world size: 8" in capsys.readouterr().out


def test_the_server_plan_by_hand():
    """Qwen3-VL-8B in bf16 on one 80 GB GPU at gpu_memory_utilization 0.9, and at tensor
    parallel 2: weights 2 B x 8.77e9; K and V of 36 layers x 8 heads x 128 dims in bf16 are
    147,456 B a token, 4.83 GB for 32,768 tokens; tensor parallelism halves both."""
    from paravt.run.memory_plan import SERVER_KV, ServerInputs, server_plan

    size = PUBLISHED["qwen3_vl_8b"]
    one = server_plan(size, ServerInputs(1, 0.9, 64, 32768, 80.0))
    assert one["server weights bf16 (1/1 of the model)"] == 17.54e9
    assert one["KV cache of one trajectory at max_model_len"] == 32768 * 147456
    assert one[SERVER_KV] == pytest.approx(72e9 - 17.54e9)
    assert one["KV cache of max_num_seqs=64 at max_model_len"] == 64 * 32768 * 147456
    two = server_plan(size, ServerInputs(2, 0.9, 64, 32768, 80.0))
    assert two["server weights bf16 (1/2 of the model)"] == 17.54e9 / 2
    assert two["KV cache of one trajectory at max_model_len"] == 32768 * 147456 / 2


def test_the_trainers_plan_with_servers_drops_only_the_engine():
    """The same trainer with rollout/engine=hf: its rollout peak is the servers' plus the
    engine's bf16 copy and the KV cache of its 8 rollouts (hand-computed); the update's the
    same plus the copy."""
    from dataclasses import replace

    from paravt.run.memory_plan import plan
    from paravt.run.recipe_memory import plan_inputs
    from paravt.run.recipe_problems import compose

    size = PUBLISHED["qwen3_vl_8b"]
    servers = plan_inputs(compose(ONE_PLUS_SEVEN), 80.0)
    assert servers.engine == "vllm_server"
    apart, hf = plan(size, servers), plan(size, replace(servers, engine="hf"))
    copy, kv = 2 * size.total_params, 1 * 8 * 32768 * 147456
    assert hf["peak rollout phase"] - apart["peak rollout phase"] == pytest.approx(copy + kv)
    assert hf["peak update phase"] - apart["peak update phase"] == pytest.approx(copy)
