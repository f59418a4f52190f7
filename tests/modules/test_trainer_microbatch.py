"""GRPOModule's own update (`_mini_step`) gives the same gradients whatever the micro-batch cut.

Run inside a live Lightning fit (so `manual_backward` is the trainer's) on the real tiny
Qwen3-VL, with real multi-turn teacher trajectories (tool calls, real crops, tool responses with
mask 0, structural tags to anchor) plus an empty row; the behaviour log-probs are the policy's
own, so no token is clipped away. For every aggregation and loss variant, the policy-loss +
structural-anchor + KL-loss gradient with many micro-batches equals the one-piece gradient within
1e-6 (at the trainer level; tests/rl/test_microbatch.py is the core's proof).
The loss a user lifts (`PARAGRPOLoss` built from the trainer's config, called once on the whole
batch with log-probs of `trajectory_logprobs`) gives the same gradient as the trainer's update.
The packed update (`algorithm.pack_update=true`: one padding-free row per micro-batch, its text
attention per trajectory under `GRPOModule._attention`, paravt.models.varlen_attention) gives the
padded one-piece gradient within 1e-5 under the same cuts, and the same log-probs and entropies.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from hydra import compose, initialize_config_dir

from paravt.rl.losses import AGGREGATIONS, NEEDS_PROXIMAL, POLICY_LOSSES
from paravt.rl.paragrpo_loss import PARAGRPOLoss
from paravt.run.build import build_run

ROOT = Path(__file__).resolve().parents[2]
# ppo_engine_is, tis and mis are decoupled_ppo's arithmetic with their own weights
# (tests/rl/test_mismatch.py, test_importance.py), so the trainer's cut-invariance of
# decoupled_ppo covers them; leaving them out keeps this test's cost.
LOSSES = sorted(set(POLICY_LOSSES) - {"ppo_engine_is", "tis", "mis"})
ONE_PIECE = 10**7  # padded tokens: every row in one micro-batch


def teacher_trajectories(processor, samples):
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.scripts import needle_teacher
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    teacher = ScriptedEngine(processor.tokenizer, needle_teacher(samples, "search"))
    loop = AgentLoop(teacher, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=2))
    return loop.run(samples, [4] * len(samples), 1, SamplingParams(greedy=True))


def on_policy(module, trajs):
    """The trajectories with the policy's own log-probs as behaviour (ratios 1), made ragged:
    row 1 trains nothing, row 2 only its first 40 response tokens."""
    with torch.no_grad():
        logp, _, _ = module._logp(module.policy, trajs, 1.0)
    out = []
    for i, t in enumerate(trajs):
        cap = {1: 0, 2: 40}.get(i, len(t.loss_mask))
        trained = itertools.accumulate(t.loss_mask)
        mask = tuple(m if n <= cap else 0 for m, n in zip(t.loss_mask, trained, strict=True))
        row = logp[i, : len(mask)].tolist()
        lp = tuple(float(v) if m else 0.0 for v, m in zip(row, mask, strict=True))
        out.append(replace(t, loss_mask=mask, logprobs=lp))
    return out


def grads_of(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def lifted_gradient(module, items, loss_fn: PARAGRPOLoss) -> dict[str, torch.Tensor]:
    """The gradient of the loss as a user lifts it: `loss_fn` once over the whole batch, fed by
    public functions (log-probs, structural mask), no micro-batch."""
    from paravt.models.forward import TokenIds, trajectory_logprobs
    from paravt.rewards.structural import structural_mask

    trajs = [t for t, _, _ in items]
    ids = TokenIds.from_tokenizer(module.processor.tokenizer)
    with torch.no_grad():
        ref, _, _ = trajectory_logprobs(module.reference, trajs, ids)
        old, _, _ = trajectory_logprobs(module.policy, trajs, ids)  # before the update
    module.policy.zero_grad(set_to_none=True)
    logp, batch, _ = trajectory_logprobs(module.policy, trajs, ids)
    formed = torch.tensor([f for _, _, f in items])
    struct = structural_mask(batch.input_ids, batch.loss_mask, module.struct_ids, formed)
    needs_old = loss_fn.config.loss in NEEDS_PROXIMAL  # plain ppo: the sampler's log-probs
    loss = loss_fn(
        logp,
        old if needs_old else batch.old_logp,
        torch.tensor([a for _, a, _ in items]),
        batch.loss_mask,
        behaviour_logprobs=batch.old_logp if needs_old else None,
        structural_mask=struct,
        ref_logprobs=ref,
    )
    loss.backward()
    return grads_of(module.policy)


class MicroBatchProbe(pl.Callback):
    """Before the first training step, runs `_mini_step` under every (aggregation, loss, budget)
    and keeps the accumulated gradients, and the gradient of the lifted `PARAGRPOLoss` built from
    the same config."""

    def __init__(self, samples, budgets):
        self.samples, self.budgets = samples, budgets
        self.grads: dict[tuple[str, str, int, bool], dict[str, torch.Tensor]] = {}
        self.lifted: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
        self.chunks: dict[tuple[int, bool], int] = {}
        self.logp: dict[bool, torch.Tensor] = {}
        self.entropy: dict[bool, torch.Tensor] = {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        trajs = on_policy(module, teacher_trajectories(module.processor, self.samples))
        self.trained = [t.num_trained_tokens for t in trajs]
        self.lengths = [len(t.token_ids) for t in trajs]
        width = max(self.lengths)
        self.scored = torch.tensor(
            [
                list(t.loss_mask) + [0] * (width - n)
                for t, n in zip(trajs, self.lengths, strict=True)
            ]
        ).bool()
        self.structural = sum("</tool_call>" in t.response_text for t in trajs)
        adv = [1.0, -0.7, 0.4, -1.3][: len(trajs)]
        formed = [True, True, False, True][: len(trajs)]
        items = list(zip(trajs, adv, formed, strict=True))
        algo = module.algo
        for pack in (False, True):
            module.algo = replace(algo, pack_update=pack)
            with torch.no_grad(), module._attention():
                logp, _, entropy = module._logp(module.policy, trajs, 1.0, entropy=True)
                self.logp[pack], self.entropy[pack] = logp, entropy
        cuts = [(b, False) for b in self.budgets] + [(self.budgets[0], True)]
        norm_length = module.loss_fn.config.norm_length  # the DataModule's, set up by the fit
        for agg, loss, (budget, pack) in itertools.product(sorted(AGGREGATIONS), LOSSES, cuts):
            module.algo = replace(
                algo, aggregation=agg, loss=loss, micro_batch_tokens=budget, pack_update=pack
            )
            module.loss_fn = PARAGRPOLoss(replace(module.algo, norm_length=norm_length))
            self.chunks[budget, pack] = len(module._chunks(trajs))
            module.policy.zero_grad(set_to_none=True)
            with module._attention():  # packed: the varlen attention, forward and backward
                module._mini_step(items, module._proximal_logprobs(trajs, 1.0), {}, 1, 1.0)
            self.grads[agg, loss, budget, pack] = grads_of(module.policy)
            if (budget, pack) == cuts[0]:
                self.lifted[agg, loss] = lifted_gradient(module, items, module.loss_fn)
        module.algo = algo
        module.loss_fn = PARAGRPOLoss(replace(algo, norm_length=norm_length))
        module.policy.zero_grad(set_to_none=True)


@pytest.mark.slow
def test_micro_batches_give_the_one_piece_gradient(tmp_path, tiny_qwen3_dir, needle_dir):
    from paravt.data.datasets import load_samples

    samples, _ = load_samples(needle_dir / "train.jsonl")
    overrides = [
        "model=tiny_qwen3",
        "data=needle",
        "trainer=cpu",
        "trainer.max_steps=1",
        f"run_dir={tmp_path}",
        f"model.path={tiny_qwen3_dir}",
        "model.build_tiny=null",
        f"data.train_path={needle_dir / 'train.jsonl'}",
        "data.eval_path=null",
        "data.generate=null",
        "data.batch_size=1",
        "rollout.group_size=2",
        "rollout.agent.max_rounds=0",
        "rollout.agent.max_new_tokens=4",
        "callbacks.benchmark_validation=null",
        "algorithm.kl_coef=0.05",  # the KL term as a loss (needs the frozen reference)
        "algorithm.kl_in_reward=false",
        "algorithm.kl_estimator=k3",  # a loss-side KL (k1 is refused there)
        "algorithm.anchor_coef=0.1",
        "export_hf=false",
    ]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    run = build_run(cfg)
    probe = MicroBatchProbe(samples, budgets=[ONE_PIECE, 1])
    run.trainer.callbacks.append(probe)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    # The cut really differs: one micro-batch vs one row each; rows differ in trained length,
    # one row is empty and some carry structural tags, so every divisor is exercised.
    assert probe.chunks[ONE_PIECE, False] == 1 and probe.chunks[1, False] == len(samples)
    assert probe.chunks[ONE_PIECE, True] == 1  # every trajectory in one packed row
    assert len(set(probe.trained)) >= 3 and 0 in probe.trained and probe.structural >= 1
    # The packed pass's log-probs and entropies, laid out as padded rows, are the padded pass's
    # at every trained token (what the losses read); both passes score nothing else.
    padded, packed, scored = probe.logp[False], probe.logp[True], probe.scored
    assert scored.any() and torch.isfinite(padded[scored]).all()
    assert not padded[~scored].any() and not packed[~scored].any()
    torch.testing.assert_close(packed[scored], padded[scored], atol=1e-5, rtol=0)
    entropy = probe.entropy[False][scored]
    assert entropy.abs().max() > 0.1  # the sampling distribution's entropy, aligned alike
    torch.testing.assert_close(probe.entropy[True][scored], entropy, atol=1e-5, rtol=0)
    for agg, loss in itertools.product(AGGREGATIONS, LOSSES):
        whole = probe.grads[agg, loss, ONE_PIECE, False]
        scale = max(float(g.abs().max()) for g in whole.values())
        assert scale > 1e-4, (agg, loss)  # a gradient that could differ
        for budget, pack in ((1, False), (ONE_PIECE, True)):
            other = probe.grads[agg, loss, budget, pack]
            assert whole.keys() == other.keys() and whole
            worst = max(float((whole[k] - other[k]).abs().max()) for k in whole)
            assert worst < (1e-5 if pack else 1e-6), (agg, loss, budget, pack, worst, scale)
        # The loss a user lifts, built from the same config and called once on the whole batch,
        # gives the trainer's gradient: float32 both, the same tokens, only the lm_head's rows
        # differ (the trainer's runs trained tokens only), so the sums reassociate; measured
        # 6.0e-7 against a scale of 0.39 (1.5e-6 of it), hence a bound relative to the scale.
        lifted = probe.lifted[agg, loss]
        assert lifted.keys() == whole.keys()
        worst = max(float((whole[k] - lifted[k]).abs().max()) for k in whole)
        assert worst < 1e-5 * scale, (agg, loss, worst, scale)
