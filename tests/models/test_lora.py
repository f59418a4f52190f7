"""LoRA RL on the tiny Qwen3-VL: only adapters train, the reference is the
base model (adapters off, no copy), engines get merged weights, and both exports load back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.errors import UserError
from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.models.loading import PolicySpec, load_policy
from paravt.models.lora import (
    BaseView,
    LoraSpec,
    export_lora,
    fold_adapters,
    is_lora,
    lora_layers,
    lora_spec,
    merged_state_dict,
    quantization_kwargs,
)
from paravt.rollout import SamplingParams, build_engine
from paravt.run.build import build_run
from paravt.video.reader import VideoReader

ROOT = Path(__file__).resolve().parents[2]
LORA = {"rank": 4, "alpha": 8.0}


def _policy(path, lora=LORA):
    return load_policy(PolicySpec(path=str(path), lora=lora))


def _perturb(model, seed: int = 0) -> None:
    """Random adapters (B starts at 0, so a fresh adapter changes nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=g) * 0.5)


def _rollouts(model, processor, samples, n: int = 2):
    engine = build_engine("hf", model, processor)
    cfg = AgentConfig(mode="frames", max_rounds=1, max_new_tokens=24, subagent_max_tokens=8)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)
    return loop.run(samples[:2], [4, 4], n, SamplingParams(temperature=1.0, seed=3))


def _logp(model, processor, trajs) -> torch.Tensor:
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    with torch.no_grad():
        logp, batch, _ = trajectory_logprobs(model, trajs, ids, 1.0)
    return torch.where(batch.loss_mask, logp, torch.zeros_like(logp))


def test_adapters_sit_on_the_language_model_only(tiny_qwen3_dir):
    model, _ = _policy(tiny_qwen3_dir)
    names = list(lora_layers(model))
    assert names and all(".language_model." in n for n in names)
    assert len(names) == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)


def test_reference_is_the_base_model_and_engines_get_merged_weights(
    tiny_qwen3_dir, needle_samples, tmp_path
):
    policy, processor = _policy(tiny_qwen3_dir)
    base, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    _perturb(policy)
    trajs = _rollouts(policy, processor, needle_samples)
    lp_policy = _logp(policy, processor, trajs)
    # The reference: the same module with adapters off == the base model, to the last bit.
    ref = _logp(BaseView(policy), processor, trajs)
    assert torch.equal(ref, _logp(base, processor, trajs))
    assert (lp_policy - ref).abs().max() > 1e-3  # the adapters do change the policy
    # A transformers engine with its own weights: a plain model fed the merged weights.
    engine = build_engine("hf", policy, processor, share_weights=False)
    assert not is_lora(engine.model)
    _perturb(policy, seed=1)  # an update
    engine.sync_weights(policy, 1)
    trajs = _rollouts(policy, processor, needle_samples)  # sampled by the LoRA policy itself
    assert torch.allclose(
        _logp(engine.model, processor, trajs), _logp(policy, processor, trajs), atol=1e-5
    )
    # Exports: the merged model loads as any checkpoint, the adapter through peft.
    export_lora(policy, processor, tmp_path / "hf", str(tiny_qwen3_dir))
    merged, _ = load_policy(PolicySpec(path=str(tmp_path / "hf")))
    want = _logp(policy, processor, trajs)
    assert torch.allclose(_logp(merged, processor, trajs), want, atol=1e-5)
    from peft import PeftModel

    adapter = json.loads((tmp_path / "hf" / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(tiny_qwen3_dir)
    fresh, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    peft_model = PeftModel.from_pretrained(fresh, str(tmp_path / "hf" / "adapter"))
    assert torch.allclose(_logp(peft_model, processor, trajs), want, atol=1e-5)


def test_folding_keeps_the_policy_and_moves_the_reference(tiny_qwen3_dir, needle_samples):
    policy, processor = _policy(tiny_qwen3_dir)
    _perturb(policy)
    trajs = _rollouts(policy, processor, needle_samples, n=1)
    before = _logp(policy, processor, trajs)
    fold_adapters(policy)  # what reset_reference does after a cold start
    assert torch.allclose(_logp(policy, processor, trajs), before, atol=1e-5)
    assert torch.allclose(_logp(BaseView(policy), processor, trajs), before, atol=1e-5)
    assert all(not layer.lora_B["default"].weight.any() for layer in lora_layers(policy).values())
    assert (
        merged_state_dict(policy).keys()
        == load_policy(PolicySpec(path=str(tiny_qwen3_dir)))[0].state_dict().keys()
    )


@pytest.mark.slow
def test_rl_steps_change_only_the_adapters(tmp_path, tiny_qwen3_dir, needle_dir):
    overrides = [
        "trainer=cpu", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
        "cold_start=null", "data.batch_size=1", "rollout.group_size=4",
        "rollout.agent.max_rounds=1", "rollout.agent.max_new_tokens=16",
        "callbacks.benchmark_validation=null", "optimizer.lr=1e-2", "algorithm.kl_coef=0.1",
        "model.lora.rank=4", f"run_dir={tmp_path}", f"model.path={tiny_qwen3_dir}",
        "model.build_tiny=null", f"data.train_path={needle_dir / 'train.jsonl'}",
        f"data.eval_path={needle_dir / 'eval.jsonl'}", "data.generate=null",
    ]  # fmt: skip
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    run = build_run(cfg)
    module = run.module
    assert isinstance(module.reference, BaseView)  # no second copy of the weights
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    run.trainer.fit(module, datamodule=run.datamodule)
    assert run.trainer.global_step == 2
    after = module.policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "no adapter moved in 2 steps"
    assert all(".lora_A." in k or ".lora_B." in k for k in changed), changed
    (group,) = run.trainer.optimizers[0].param_groups
    assert {id(p) for p in group["params"]} == {
        id(p) for n, p in module.policy.named_parameters() if ".lora_" in n
    }
    assert "kl/reference" in run.trainer.callback_metrics
    assert not any(k.startswith("reference.") for k in module.state_dict())
    module.export_hf(str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "adapter" / "adapter_model.safetensors").exists()
    assert (tmp_path / "hf" / "config.json").exists()


def test_qlora_is_refused_without_a_cuda_gpu(tiny_qwen3_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: QLoRA may run")
    spec = PolicySpec(path=str(tiny_qwen3_dir), lora={"rank": 4, "load_in_4bit": True})
    with pytest.raises(UserError, match=r"load_in_4bit=true \(QLoRA\) needs a CUDA GPU"):
        load_policy(spec)


def test_the_export_gathers_bucket_by_bucket_and_only_rank_0_keeps_them(
    tiny_qwen3_dir, monkeypatch
):
    import weakref

    from paravt.models import full_weights
    from paravt.models.lora import merged_items

    model, _ = _policy(tiny_qwen3_dir)
    _perturb(model)
    want = merged_state_dict(model)
    writer = full_weights.writer_state_dict
    got = writer(merged_items(model), keep=True, bucket_bytes=1 << 16)  # rank 0
    assert list(got) == list(want)
    assert all(t.device.type == "cpu" and torch.equal(t, want[k]) for k, t in got.items())
    merged = {f"{n}.weight" for n in lora_layers(model)}  # new tensors, not parameters
    real, alive, buckets = full_weights.buckets, [], []

    def watched(*args, **kwargs):
        for bucket in real(*args, **kwargs):
            # every earlier bucket's merged tensors are freed before this one is gathered
            assert all(ref() is None for ref in alive)
            alive.extend(weakref.ref(t) for n, t in bucket if n in merged)
            buckets.append(len(bucket))
            yield bucket
            del bucket

    monkeypatch.setattr(full_weights, "buckets", watched)
    assert writer(merged_items(model), keep=False, bucket_bytes=1 << 16) == {}
    assert len(buckets) > 3 and len(alive) == len(merged)


QLORA = {"rank": 4, "alpha": 8.0, "load_in_4bit": True}


def test_qlora_keeps_the_vision_tower_and_what_transformers_keeps_in_full_precision(
    tiny_qwen3_dir,
):
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    kwargs = quantization_kwargs(lora_spec(QLORA), torch.float32)
    skip = kwargs["quantization_config"].llm_int8_skip_modules
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tiny_qwen3_dir))
    linear = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    kept = {n for n in linear if not should_convert_module(n, skip)}  # transformers' matching
    assert set(get_keys_to_not_convert(model)) <= kept  # its default list (lm_head) is kept
    assert kept == {n for n in linear if n.startswith("model.visual.") or n == "lm_head"}
    assert any(n.startswith("model.language_model.") for n in set(linear) - kept)


def test_qlora_under_fsdp_is_refused_before_any_weight_is_read(tiny_qwen3_dir):
    spec = PolicySpec(path=str(tiny_qwen3_dir), lora=QLORA)
    with pytest.raises(UserError, match=r"cannot run under FSDP.*load_in_4bit=false"):
        load_policy(spec, on_meta=True)  # what an FSDP trainer builds


def test_a_qlora_merge_is_dequantised_under_the_base_models_names(tiny_qwen3_dir):
    bnb = pytest.importorskip("bitsandbytes")  # 4-bit kernels on CPU too (bitsandbytes >= 0.48)
    from transformers import AutoModelForImageTextToText

    from paravt.models.head_logprobs import head_logprobs
    from paravt.models.lora import apply_lora

    plain = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    kwargs = quantization_kwargs(lora_spec(QLORA), torch.float32)
    model = AutoModelForImageTextToText.from_pretrained(
        tiny_qwen3_dir, dtype=torch.float32, **kwargs
    )
    model = apply_lora(model, lora_spec(QLORA))
    _perturb(model)
    merged = merged_state_dict(model)
    assert list(merged) == list(plain.state_dict())  # no `.absmax` / `.quant_map` keys
    for name, layer in lora_layers(model).items():
        packed = layer.get_base_layer().weight
        assert isinstance(packed, bnb.nn.Params4bit)
        base = bnb.functional.dequantize_4bit(packed.data, packed.quant_state)
        delta = layer.lora_B["default"].weight @ layer.lora_A["default"].weight
        want = base + delta * layer.scaling["default"]
        torch.testing.assert_close(merged[f"{name}.weight"], want, atol=1e-6, rtol=0)
        assert merged[f"{name}.weight"].shape == plain.state_dict()[f"{name}.weight"].shape
    for key in ("lm_head.weight", "model.visual.blocks.0.attn.qkv.weight"):
        assert torch.equal(merged[key], plain.state_dict()[key])  # kept in full precision
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad(), head_logprobs(model, ids, 1.0, [], 64, False):  # the fused path
        out = model(input_ids=ids).logits
    assert out.shape == (1, 4, 3) and torch.isfinite(out[0, :-1, 0]).all()
    with pytest.raises(NotImplementedError, match="4-bit"):  # no delta added to packed bytes
        fold_adapters(model)


@pytest.mark.parametrize(
    ("node", "match"),
    [
        ({"rank": -1}, "rank must be an int >= 0"),
        ({"rank": 4, "alpha": 0}, "alpha > 0"),
        ({"rank": 4, "rnak": 2}, r"unknown key\(s\) \['rnak'\]"),
        ({"rank": 0, "load_in_4bit": True}, "needs model.lora.rank > 0"),
    ],
)
def test_bad_lora_settings_are_named(node, match):
    with pytest.raises(UserError, match=match):
        lora_spec(node)


def test_rank_zero_means_full_fine_tuning():
    assert lora_spec({"rank": 0}) is None and lora_spec(None) is None
    assert lora_spec({"rank": 8, "target_modules": ["q_proj"]}) == LoraSpec(
        rank=8, target_modules=("q_proj",)
    )


def test_targets_that_match_nothing_are_named(tiny_qwen3_dir):
    with pytest.raises(UserError, match="match no linear layer"):
        _policy(tiny_qwen3_dir, {"rank": 4, "target_modules": ["qkv"]})
