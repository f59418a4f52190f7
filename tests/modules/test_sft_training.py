"""The SFT stage: schedule, configs, bad rows, accumulation, resume, TensorBoard, SFT -> RL."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from paravt.modules.sft import cosine_with_warmup
from paravt.run.build_sft import build_sft_run

ROOT = Path(__file__).resolve().parents[2]


def compose_cfg(overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def sft_overrides(tmp_path, tiny_dir, data_path, steps=2, *extra):
    return [
        "experiment=demo_sft",
        f"run_dir={tmp_path}",
        f"model.path={tiny_dir}",
        "model.build_tiny=null",
        f"data.train_path={data_path}",
        "data.generate=null",
        "data.batch_size=2",
        f"trainer.max_steps={steps}",
        "trainer.enable_progress_bar=false",
        "callbacks.checkpoint.every_n_train_steps=1",
        *extra,
    ]


def fit(overrides, ckpt_path=None):
    run = build_sft_run(compose_cfg(overrides))
    run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=ckpt_path)
    return run


def test_cosine_with_warmup_by_hand():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = cosine_with_warmup(opt, total_steps=20, warmup_ratio=0.1)
    lrs = []
    for _ in range(21):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warm-up of ceil(0.1 * 20) = 2 steps: 1/2, 2/2; then 0.5 (1 + cos(pi (s - 2) / 18))
    assert lrs[:3] == [0.5, 1.0, 1.0]
    assert math.isclose(lrs[11], 0.5, abs_tol=1e-9) and math.isclose(lrs[20], 0.0, abs_tol=1e-9)
    with pytest.raises(ValueError, match="warmup_ratio"):
        cosine_with_warmup(opt, total_steps=10, warmup_ratio=1.5)


def test_sft_coldstart_composes_with_the_paper_settings(tmp_path):
    cfg = compose_cfg(["experiment=sft_coldstart", f"run_dir={tmp_path}"])
    assert cfg.stage == "sft" and cfg.trainer.devices == 8 and cfg.trainer.max_steps == 500
    assert cfg.optimizer.lr == 2.0e-5 and cfg.scheduler.total_steps == 1500
    assert cfg.scheduler.warmup_ratio == 0.05 and cfg.sft.pack_tokens == 8192
    assert cfg.data.batch_size == 4  # the paper's per-device batch (data/sft.yaml's is 8)
    data = instantiate(cfg.data)
    assert (data.video.fps, data.video.max_frames, data.video.max_pixels) == (1.0, 64, 50176)
    assert type(instantiate(cfg.trainer.strategy)).__name__ == "ModelParallelStrategy"
    opt = instantiate(cfg.optimizer)([torch.nn.Parameter(torch.zeros(1))])
    sched = instantiate(cfg.scheduler)(opt)
    assert math.isclose(opt.param_groups[0]["lr"], 2.0e-5 / 75)  # step 0 of 75 warm-up steps
    assert sched.last_epoch == 0


def _bad_rows(sft_file, tmp_path) -> Path:
    rows = [json.loads(line) for line in Path(sft_file).read_text().splitlines()]
    missing = json.loads(json.dumps(rows[0]))
    missing["id"] = "missing-video"
    missing["messages"][1]["content"][0]["video_url"]["url"] = str(tmp_path / "nope.mp4")
    broken = {"id": "no-assistant", "messages": [{"role": "user", "content": "hi"}]}
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [missing, broken, *rows]))
    return path


def test_bad_rows_are_reported_and_skipped_never_crashing(tmp_path, tiny_qwen3_dir, sft_file):
    data = _bad_rows(sft_file, tmp_path)
    run = fit(sft_overrides(tmp_path, tiny_qwen3_dir, data, 2, "data.shuffle=false"))
    assert run.trainer.global_step == 2
    assert [rid for rid, _ in run.datamodule.skipped] == ["no-assistant"]
    assert "last message must be the assistant" in run.datamodule.skipped[0][1]
    batch = run.datamodule.dataset()[0]  # first micro-batch: the missing video + a good row
    assert [rid for rid, _ in batch.skipped] == ["missing-video"] and len(batch.examples) == 1
    assert "nope.mp4" in batch.skipped[0][1]


def test_parquet_rows_train_like_jsonl(tmp_path, tiny_qwen3_dir, sft_file):
    from paravt.data.sft_datamodule import load_conversations
    from paravt.data.sft_writer import write_rows

    rows = [json.loads(line) for line in Path(sft_file).read_text().splitlines()]
    parquet = write_rows(rows, tmp_path / "train.parquet")
    assert load_conversations(str(parquet)) == load_conversations(str(sft_file))


def test_accumulation_and_resume_replay_the_uninterrupted_run(tmp_path, tiny_qwen3_dir, sft_file):
    acc = ["trainer.accumulate_grad_batches=2", "scheduler.total_steps=4"]
    full = fit(sft_overrides(tmp_path / "full", tiny_qwen3_dir, sft_file, 4, *acc))
    # 4 optimiser steps x 2 accumulated micro-batches = 8 micro-batches (max_batches derived)
    assert full.trainer.global_step == 4 and full.datamodule.consumed == 8
    fit(sft_overrides(tmp_path / "cut", tiny_qwen3_dir, sft_file, 2, *acc))
    resumed = fit(
        sft_overrides(tmp_path / "cut", tiny_qwen3_dir, sft_file, 4, *acc), ckpt_path="last"
    )
    assert resumed.trainer.global_step == 4 and resumed.datamodule.consumed == 8
    a, b = full.module.policy.state_dict(), resumed.module.policy.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    lr_full = full.trainer.optimizers[0].param_groups[0]["lr"]
    assert math.isclose(lr_full, resumed.trainer.optimizers[0].param_groups[0]["lr"])


# `python train.py experiment=demo_sft` as a user runs it (3 steps: the log, the TensorBoard
# scalars, the learning-rate schedule, the trained export) and RL continuing from its export are
# asserted on the docs' CPU chain (tests/test_doc_commands.py,
# test_the_cpu_chain_runs_from_a_fresh_folder), which runs those very commands.


def test_one_code_path_for_cold_starts_inside_rl(tiny_qwen3_dir, needle_samples):
    """SFTModule wraps an existing policy; its loss on loop trajectories is `sft_loss` of the
    RL trainer's teacher-forced pass, and `fit_steps` learns the answer tokens."""
    from functools import partial

    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.scripts import needle_teacher
    from paravt.models.forward import TokenIds, trajectory_logprobs
    from paravt.modules.sft import SFTModule, example_from_trajectory, sft_loss
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    policy = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)
    engine = ScriptedEngine(processor.tokenizer, needle_teacher(needle_samples, "search"))
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=2))
    trajs = loop.run(needle_samples, [4] * len(needle_samples), 1, SamplingParams(greedy=True))
    examples = [example_from_trajectory(t, processor.tokenizer) for t in trajs]
    for e, s in zip(examples, needle_samples, strict=True):
        answer = [t for t, f in zip(e.trajectory.token_ids, e.answer_mask, strict=True) if f]
        assert processor.tokenizer.decode(answer) == s.answer
    optimizer = partial(torch.optim.AdamW, lr=3e-3, weight_decay=0.0)
    module = SFTModule(policy=policy, processor=processor, optimizer=optimizer, packing=False)
    with torch.no_grad():
        stats, _ = module.compute(examples)
        logp, padded, _ = trajectory_logprobs(
            policy, trajs, TokenIds.from_tokenizer(processor.tokenizer)
        )
        torch.testing.assert_close(stats.loss, sft_loss(logp, padded.loss_mask))
    # The loss falls from 6.26 to 2.08 in 20 steps (3.13, half of it, at step 14).
    records = module.fit_steps(examples, steps=20, batch_size=4)
    assert records[-1]["loss"] < 0.5 * records[0]["loss"]
    assert {"answer_loss", "answer_accuracy"} <= set(records[0])


def test_fit_steps_curriculum_answer_weight_and_pooled_answer_metrics(
    tiny_qwen3_dir, needle_samples
):
    """What the demo's cold start asks of SFTModule: a lead pool for the first steps, an extra
    weight on answer tokens, clipping, per-step callbacks, answer metrics pooled over chunks.
    The learning rate is 0, so any weights do: the tiny model's, not the trained `tool_caller`
    (whose 80 training steps this file's worker would otherwise build or wait for)."""
    from functools import partial

    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.scripts import needle_teacher
    from paravt.data.sft_encode import SFTExample
    from paravt.modules.sft import SFTModule, example_from_trajectory
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    policy = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)

    def examples(strategy):
        engine = ScriptedEngine(processor.tokenizer, needle_teacher(needle_samples, strategy))
        loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=2))
        trajs = loop.run(needle_samples, [4] * len(needle_samples), 1, SamplingParams(greedy=True))
        return [example_from_trajectory(t, processor.tokenizer) for t in trajs]

    main, lead = examples("search"), examples("direct")  # different token sequences
    optimizer = partial(torch.optim.SGD, lr=0.0)  # lr 0: every step sees the same weights
    module = SFTModule(
        policy=policy, processor=processor, optimizer=optimizer, packing=False, answer_weight=2.0
    )
    with torch.no_grad():
        on_lead, _ = module.compute(lead[:2])
        on_main, _ = module.compute(main[2:4])
    seen = []
    records = module.fit_steps(
        main, 2, 2, lead=lead, lead_steps=1, max_grad_norm=1.0, on_step=seen.append
    )
    assert seen == [1, 2]
    # step 0 drew from the lead pool, step 1 (rows 2, 3) from the main one
    assert records[0]["token_loss"] == pytest.approx(on_lead.loss.item(), rel=1e-5)
    assert records[1]["token_loss"] == pytest.approx(on_main.loss.item(), rel=1e-5)
    for rec in records:  # the objective adds 2 x the answer tokens' mean NLL
        assert rec["loss"] == pytest.approx(rec["token_loss"] + 2.0 * rec["answer_loss"], 1e-5)
    # pooled over answer tokens, whatever the chunking
    whole = module.answer_metrics(main, chunk=len(main))
    assert module.answer_metrics(main, chunk=3) == pytest.approx(whole, rel=1e-5)
    assert whole[0] > 0.0 and 0.0 <= whole[1] <= 1.0
    unmarked = [SFTExample(e.id, e.trajectory, (0,) * e.num_tokens) for e in main[:2]]
    assert module.answer_metrics(unmarked) is None


def test_ranks_read_disjoint_micro_batches():
    from paravt.data.sft_datamodule import _Batches

    convs = list(range(5))  # only positions are computed: nothing is encoded

    def items(world, rank, count):
        data = _Batches(convs, 2, 0, True, 0, count, (None, None, None), world, rank)
        return [data.positions(i) for i in range(count)]

    single = items(1, 0, 6)
    # rank r of 2 takes global micro-batches 2i + r: together, the single-rank sequence
    assert items(2, 0, 3) == single[0::2] and items(2, 1, 3) == single[1::2]
    # each epoch of 5 conversations is a permutation (6 micro-batches of 2 span 2.4 epochs)
    flat = [j for item in single for j in item]
    assert sorted(flat[:5]) == convs and sorted(flat[5:10]) == convs
