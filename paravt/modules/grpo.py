"""GRPOModule: the LightningModule of PARA-GRPO (reward -> advantage -> update -> record).

Each step receives a `RolloutBatch` that the `RolloutDataModule` generated right before it with
the weights after update t-1 (or up to `rollout.max_staleness` updates older); the engine's
weight version and the staleness arrive with the batch and are logged. Optimisation is manual:
PPO epochs x mini-batches of optimiser steps, gradients accumulated over micro-batches of a
padded-token budget, clipped.
Data parallel (FSDP2 under Lightning's ModelParallelStrategy, `trainer=fsdp`): `configure_model`
shards policy and reference; each rank updates on its own prompts' groups with loss divisors of
the GLOBAL batch, and runs the same number of forward/backward passes as every other rank
(zero-weight dummy micro-batches), so the collectives never wait on a rank that has finished.
The arithmetic lives in the pure core (`paravt.rl`, `paravt.rewards`); this file sequences it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, astuple, replace

import lightning.pytorch as pl
import torch

from paravt.data.packing import model_rope_index
from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.models.loading import PolicySpec, load_policy
from paravt.models.lora import BaseView, export_lora, fold_adapters, is_lora
from paravt.models.runtime import PhaseTimer, grad_norm, pad_rows, rng_state, set_rng_state
from paravt.models.varlen_attention import varlen_attention
from paravt.models.vision_cache import take_stats as take_feature_stats
from paravt.modules.packed_forward import packed_chunks, packed_trajectory_logprobs
from paravt.parallel.distributed import (
    MicroBatch,
    Rank,
    agree_max,
    filler_trajectory,
    global_float_sums,
    global_sums,
    mean_over_ranks,
    pad_micro_batches,
)
from paravt.rewards.compose import RewardWeights, anchored, trajectory_reward
from paravt.rewards.judge import LLMJudge
from paravt.rewards.judge_guard import JudgeGuard
from paravt.rewards.judged import judged_rewards
from paravt.rewards.structural import structural_mask, structural_token_ids
from paravt.rl.algorithm import AlgorithmConfig
from paravt.rl.importance import gap_metrics, gap_sums
from paravt.rl.kl import fold_kl_into_rewards, kl_penalty, sequence_kl
from paravt.rl.microbatch import (
    MicroWeights,
    TermSizes,
    max_response_tokens,
    mini_sizes,
    split_even,
    split_weights,
    token_budget_chunks,
)
from paravt.rl.mismatch import mismatch_metrics, needs_trainer_logprobs
from paravt.rl.objective import advantage_metrics, compute_advantages, rollout_metrics
from paravt.rl.paragrpo_loss import PARAGRPOLoss
from paravt.rl.truncation import keep_uncut
from paravt.rollout.records import RolloutBatch, RolloutRecord
from paravt.types import RewardBreakdown, Sample, Trajectory

ZERO_WEIGHTS = MicroWeights(policy=0.0, kl=0.0, anchor=0.0)
# Skip counts each rank keeps of its own prompts (summed over ranks; load-time ones are equal).
SKIP_SUMS = (
    "rollout/skipped_prompts",
    "data/skipped_prompts",
    "data/undecodable_videos",
    "data/undecodable_eval_videos",
)


def response_cap(datamodule) -> int | None:
    """The longest response `datamodule`'s agent lets the policy write (a RolloutDataModule's
    `rollout.agent` token caps); None for a DataModule without an agent config."""
    agent = getattr(getattr(datamodule, "rollout", None), "agent", None)
    if agent is None:
        return None
    return max_response_tokens(agent.max_new_tokens, agent.max_rounds)


def check_loaded_keys(missing: Sequence[str], unexpected: Sequence[str], saved_reference: bool):
    """Refuse a checkpoint that does not match the module: policy keys missing or unknown keys.
    The frozen reference may be absent (rebuilt from model.path), but not half there, and a
    saved one the module does not hold (KL turned off at resume) is left unused."""
    missing = [k for k in missing if saved_reference or not k.startswith("reference.")]
    unexpected = [k for k in unexpected if not k.startswith("reference.")]
    if missing or unexpected:
        shown = ", ".join([*missing[:5], *unexpected[:5]])
        raise RuntimeError(
            f"the checkpoint does not match the model: {len(missing)} key(s) missing, "
            f"{len(unexpected)} unexpected (first: {shown}); fix: resume with the model.path and "
            "model.lora settings the checkpoint was trained with"
        )


class GRPOModule(pl.LightningModule):
    """Policy (+ frozen reference when KL is on) and the PARA-GRPO update of generated batches.

    Implements the DataModule's `RolloutPolicy` (policy, processor, policy_version, model_path)
    and the callbacks' Protocols (`set_format_weight`, `set_anchor_coef`, `last_rollout`).
    """

    def __init__(
        self,
        model: PolicySpec,
        algorithm: AlgorithmConfig,
        reward: RewardWeights,
        optimizer: Callable,
        scheduler: Callable | None = None,
        init_on_meta: bool = False,
        judge: LLMJudge | None = None,
        judge_guard: JudgeGuard | None = None,
    ):
        """`init_on_meta` (set by `build_module` for FSDP2 trainers): policy and reference are
        meta-device skeletons until `configure_model` shards them and rank 0 fills the shards.
        `judge`: an LLM judge for open-ended answers, its fallbacks checked by `judge_guard`."""
        super().__init__()
        self.automatic_optimization = False
        self.spec, self.algo = model, algorithm
        self.model_path: str | None = model.path
        self.reward_weights = reward
        self.anchor_coef = algorithm.anchor_coef
        # The loss of each micro-batch; `setup` gives it Dr.GRPO's divisor when that is unset.
        self.loss_fn = PARAGRPOLoss(algorithm)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.judge, self.judge_guard = judge, judge_guard or JudgeGuard()
        self.policy, self.processor = load_policy(model, on_meta=init_on_meta)
        self.reference = None
        self.reference_in_checkpoint = False  # True once a cold start copies the policy into it
        if algorithm.kl_coef > 0 and is_lora(self.policy):  # adapters off: no second copy
            self.reference = BaseView(self.policy)
        elif algorithm.kl_coef > 0:
            self.reference = copy.deepcopy(self.policy).requires_grad_(False).eval()
        tok = self.processor.tokenizer
        self.token_ids = TokenIds.from_tokenizer(tok)
        # Checked up front (a clear error naming the tag) whenever the anchor can be used.
        self.struct_ids = structural_token_ids(tok, algorithm.anchor_tags)
        self.policy_version = 0  # optimiser updates applied to the policy
        self.last_rollout: RolloutRecord | None = None
        self.reward_history: list[tuple[int, float]] = []  # (step, mean reward)
        self._reference_kl = 0.0
        self.resumed_step: int | None = None  # the checkpoint's global step after a resume
        self._fresh_version, self._gaps = -1, []  # the step's engine/trainer gap parts
        self._old_vision = (0, 0, 0.0)  # the proximal pass's vision-cache figures this step

    @property
    def updates_per_step(self) -> int:
        """Optimiser updates (policy versions) one training step makes at most."""
        return self.algo.ppo_epochs * self.algo.ppo_mini_batches

    # ---- the callbacks' Protocols -----------------------------------------------------------
    def set_format_weight(self, weight: float) -> None:
        """w_fmt of the format reward from now on (FormatAnchorCurriculum)."""
        self.reward_weights = replace(self.reward_weights, format_weight=float(weight))

    def set_anchor_coef(self, coef: float) -> None:
        """The structural-token anchor coefficient from now on (FormatAnchorCurriculum)."""
        self.anchor_coef = float(coef)

    def reset_reference(self) -> None:
        """Make the frozen reference a copy of the current policy (e.g. after a cold start).
        LoRA: the adapters are folded into the base weights and restart at zero."""
        if is_lora(self.policy):
            fold_adapters(self.policy)
        elif self.reference is not None:
            self.reference.load_state_dict(self.policy.state_dict())
            self.reference_in_checkpoint = True  # model.path no longer rebuilds it

    def setup(self, stage: str) -> None:
        """Dr.GRPO's divisor when `algorithm.norm_length` is unset: the most tokens the
        DataModule's agent lets the policy write (`max_response_tokens`), so a module built in
        Python divides as one built by train.py does."""
        if self.algo.norm_length is None:
            cap = response_cap(getattr(self.trainer, "datamodule", None))
            self.loss_fn = PARAGRPOLoss(replace(self.algo, norm_length=cap))

    def configure_model(self) -> None:
        """FSDP2 under Lightning's ModelParallelStrategy: shard (and, from a meta skeleton,
        fill) policy and reference (`paravt.parallel.fsdp.configure_sharding`); one device:
        no-op."""
        from paravt.parallel.fsdp import configure_sharding

        # LoRA: the reference is a view of the policy (adapters off), sharded with it.
        frozen = self.reference if isinstance(self.reference, torch.nn.Module) else None
        configure_sharding(self, self.spec, self.policy, frozen)

    def configure_optimizers(self):
        opt = self.optimizer_factory([p for p in self.policy.parameters() if p.requires_grad])
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": self.scheduler_factory(opt)}

    # ---- the step, as phases ----------------------------------------------------------------
    def training_step(self, batch: RolloutBatch, batch_idx):
        if not isinstance(batch, RolloutBatch):
            raise TypeError(
                f"GRPOModule.training_step needs a RolloutBatch, got {type(batch).__name__}; "
                "train with paravt.modules.rollout_datamodule.RolloutDataModule, which generates "
                "the rollouts of each prompt batch"
            )
        timer = PhaseTimer()
        trajs = list(batch.trajectories)
        temp = batch.temperature  # every log-prob of the step is at the sampling temperature
        with timer("reward"):
            rewards, judged = self._rewards(trajs, batch.repeated_samples())
        take_feature_stats(self.policy, self.reference)  # what ran between steps (evaluation)
        with self._attention():
            with timer("logprobs"):
                totals = self._rewards_with_kl(trajs, rewards, temp)
            ref_vision = take_feature_stats(self.policy, self.reference)
            adv = compute_advantages(  # batch-normalised over every rank's share
                totals.view(len(batch.samples), batch.group_size),
                self.algo.advantage,
                global_float_sums,
            )
            keep, cut = adv.keep, 0
            if self.algo.mask_truncated:  # cut trajectories leave the loss (paravt.rl.truncation)
                keep, cut = keep_uncut(keep, trajs)
            with timer("update"):
                formed = anchored(rewards, self.algo.anchor_rollouts)
                update = self._update(trajs, adv.values, keep, formed, temp)
        self.last_rollout = self._record(batch, rewards)
        metrics = rollout_metrics(trajs, rewards)
        metrics |= update | timer.metrics() | advantage_metrics(adv)
        metrics |= {f"time/{k}": v for k, v in batch.timings.items()}
        metrics["rollout/staleness"] = float(batch.staleness)
        if self.algo.mask_truncated:
            metrics["update/masked_truncated"] = float(cut)
        if "loss/iw_capped_frac" in update:  # share the importance correction clipped or masked
            metrics["mismatch/corrected_frac"] = update["loss/iw_capped_frac"]
        if self.reference is not None and self.algo.kl_in_reward:
            metrics["kl/reference"] = self._reference_kl
        metrics["weight_version"] = float(batch.weight_version)
        metrics["rollout/skipped_prompts"] = float(len(batch.skipped))  # undecodable videos
        metrics |= batch.counts | judged
        metrics |= self._vision_metrics(batch.counts, ref_vision)
        # Every rank logs the global batch's figures; each rank skips its own prompts' videos.
        # Ranks hold unequal shares when B is not a multiple of W: weigh each by its rollouts.
        sums = ("update/trajectories", "update/trained_tokens", *SKIP_SUMS)
        # The losses (token-weighted within a rank) are weighed by each rank's trained tokens:
        # with one mini-batch a step they are the global batch's, as one process logs them.
        losses = {k: metrics.pop(k) for k in [k for k in metrics if k.startswith("loss/")]}
        metrics = mean_over_ranks(metrics, sums=sums, weight=len(trajs))
        metrics |= mean_over_ranks(losses, weight=update["update/trained_tokens"])
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=len(trajs))
        self.log("reward", metrics["reward/mean"], prog_bar=True, batch_size=len(trajs))
        self.reward_history.append((batch.step, metrics["reward/mean"]))
        return None

    def score(self, traj: Trajectory, sample: Sample) -> RewardBreakdown:
        return trajectory_reward(traj, sample, self.reward_weights)

    def _rewards(self, trajs, samples) -> tuple[list[RewardBreakdown], dict[str, float]]:
        """Every rollout's reward, and the judge's metrics when there is one (it may stop the
        run: paravt.rewards.judge_guard); the judge's counts are summed over the ranks."""
        if self.judge is None:
            return [self.score(t, s) for t, s in zip(trajs, samples, strict=True)], {}
        return judged_rewards(
            trajs, samples, self.reward_weights, self.judge, self.judge_guard, global_sums
        )

    def _vision_metrics(self, counts, ref: tuple[int, int, float]) -> dict[str, float]:
        """Seconds in the vision tower per phase (old = proximal and reference log-probs) and
        the step's feature and crop cache hit rates (paravt.models.vision_cache)."""
        update = take_feature_stats(self.policy, self.reference)
        old, self._old_vision = self._old_vision, (0, 0, 0.0)
        hits = counts.get("vision_cache/rollout_feature_hits", 0.0) + ref[0] + old[0] + update[0]
        clips = counts.get("vision_cache/rollout_feature_clips", 0.0)
        clips += sum(s[0] + s[1] for s in (ref, old, update))
        crops = counts.get("vision_cache/crop_lookups", 0.0)
        return {
            "time/logprobs_vision": ref[2] + old[2],
            "time/update_vision": update[2],
            "vision_cache/feature_hit_rate": hits / clips if clips else 0.0,
            "vision_cache/tower_clips": clips - hits,  # clips the vision tower encoded
            "vision_cache/crop_hit_rate": (
                counts.get("vision_cache/crop_hits", 0.0) / crops if crops else 0.0
            ),
        }

    def _rewards_with_kl(self, trajs, rewards, temperature: float) -> torch.Tensor:
        """R - kl_coef * KL(sampling policy || reference) per rollout (reward-side KL).

        The sampling policy's log-probs are the behaviour log-probs the engine returned, so only
        the reference needs a forward pass.
        """
        totals = torch.tensor([r.total for r in rewards], dtype=torch.float32)
        if self.reference is None or not self.algo.kl_in_reward:
            return totals
        seq_kl = torch.zeros_like(totals)
        with torch.no_grad():
            for mb in pad_micro_batches(self._chunks(trajs)):
                ref, batch, _ = self._logp(self.reference, self._rows(trajs, mb), temperature)
                if mb.dummy:  # only keeps the sharded reference's collectives in step
                    continue
                behaviour = batch.old_logp.to(ref.device)
                mask = batch.loss_mask.to(ref.device)
                per_token = kl_penalty(behaviour, ref, self.algo.kl_estimator, mask)
                seq_kl[list(mb.indices)] = sequence_kl(per_token, mask).cpu()
        # A rank whose prompts were all skipped (undecodable videos) ran dummies only.
        self._reference_kl = float(seq_kl.mean()) if len(trajs) else 0.0
        return fold_kl_into_rewards(totals, seq_kl, self.algo.kl_coef)

    def _attention(self):
        """Packed: the text decoders attend per trajectory (paravt.models.varlen_attention) over
        the step's forwards AND backwards (checkpointed activations are recomputed in backward)."""
        if not self.algo.pack_update:
            return nullcontext()
        return varlen_attention(*(m for m in (self.policy, self.reference) if m is not None))

    def _logp(self, model, trajs, temperature: float, entropy: bool = False):
        """(logp [N, T], padded batch, entropy [N, T] if asked), packed or padded; every
        consumer reads the trained tokens only, so only those go through the lm_head."""
        if self.algo.pack_update:
            rope = model_rope_index(model)
            ids = self.token_ids
            return packed_trajectory_logprobs(
                model, trajs, ids, rope, temperature, entropy, only_trained=True
            )
        return trajectory_logprobs(
            model, trajs, self.token_ids, temperature, return_entropy=entropy, only_trained=True
        )

    # ---- the update -------------------------------------------------------------------------
    def _update(
        self, trajs, adv: torch.Tensor, keep: torch.Tensor, formed, temperature: float
    ) -> dict[str, float]:
        """PPO epochs x mini-batches of optimiser steps over the kept (trajectory, advantage,
        well-formed) items; sub-agent rollouts join with their main trajectory's advantage."""
        rows = zip(trajs, adv.tolist(), keep.tolist(), formed, strict=True)
        items = [(t, a, f) for t, a, k, f in rows if k]
        if self.algo.train_subagents:
            # docs/method.md pitfall 4; sub-agent text has no structural tags to anchor.
            items += [(s, a, False) for t, a, _ in list(items) for s in t.sub_trajectories]
        prox = self._proximal_logprobs([t for t, _, _ in items], temperature)
        self._old_vision = take_feature_stats(self.policy, self.reference)
        # The first mini-batch's forward runs the pre-update weights: its log-probs against the
        # engine's are the step's mismatch figures, at no extra pass (paravt.rl.importance).
        self._fresh_version, self._gaps = self.policy_version, []
        opt = self.optimizers()
        sums: dict[str, float] = {}
        updates = self.algo.ppo_epochs * self.algo.ppo_mini_batches
        # An empty batch (every group dropped as zero-variance) still takes one (no-op) step, so
        # the step count, the checkpoints and the data position keep moving together.
        minis = split_even(list(range(len(items))), self.algo.ppo_mini_batches) or [[]]
        # Every rank takes the same number of optimiser steps (a rank with fewer items, or none,
        # runs empty mini-batches of zero-weight passes): each step is a collective.
        minis += [[]] * (agree_max(len(minis)) - len(minis))
        for _ in range(self.algo.ppo_epochs):
            for mini in minis:
                chosen = [items[i] for i in mini]
                self._mini_step(chosen, [prox[i] for i in mini], sums, updates, temperature)
                sums["grad_norm"] = grad_norm(self.policy)  # before clipping
                self.clip_gradients(opt, gradient_clip_val=self.algo.max_grad_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if self.scheduler_factory is not None:
                    self.lr_schedulers().step()
                self.policy_version += 1
        sums |= gap_metrics(self._gaps)
        sums["update/trajectories"] = float(len(items))
        sums["update/trained_tokens"] = float(sum(t.num_trained_tokens for t, _, _ in items))
        return sums

    def _proximal_logprobs(self, trajs, temperature: float) -> list[torch.Tensor | None]:
        """pi_prox for the decoupled loss: the policy before this update, one pass, no grad."""
        if not needs_trainer_logprobs(self.algo.loss):
            return [None] * len(trajs)
        out: list[torch.Tensor | None] = [None] * len(trajs)
        with torch.no_grad():
            for mb in pad_micro_batches(self._chunks(trajs)):
                logp, _, _ = self._logp(self.policy, self._rows(trajs, mb), temperature)
                if mb.dummy:
                    continue
                for row, i in enumerate(mb.indices):
                    out[i] = logp[row, : len(trajs[i].token_ids)].detach()
        return out

    def _chunks(self, trajs) -> list[list[int]]:
        """Indices of `trajs` in micro-batches of the configured (padded or packed) budget."""
        lengths = [len(t.token_ids) for t in trajs]
        cut = packed_chunks if self.algo.pack_update else token_budget_chunks
        return cut(lengths, self.algo.micro_batch_tokens)

    def _rows(self, trajs: Sequence[Trajectory], mb: MicroBatch) -> list[Trajectory]:
        """The trajectories of micro-batch `mb` (a filler row for a dummy on an empty rank)."""
        if mb.indices:
            return [trajs[i] for i in mb.indices]
        return [filler_trajectory(self.processor.tokenizer.pad_token_id)]

    def _mini_step(
        self, items, prox, sums: dict[str, float], updates: int, temperature: float
    ) -> None:
        # Each loss term of a micro-batch is weighted by its share of that term's divisor over
        # the GLOBAL mini-batch (all ranks; paravt.rl.microbatch), times the world size that
        # FSDP's gradient average divides by, so the accumulated gradient is the mini-batch's
        # whatever the cut and the number of ranks; metrics are averaged by trained-token share.
        trajs = [t for t, _, _ in items]
        rows = [(t.token_ids, t.loss_mask, f) for t, _, f in items]
        chunks = self._chunks(trajs)
        world = Rank.current().world_size
        mini = mini_sizes(rows, self.struct_ids)
        if world > 1:
            mini = TermSizes(*(int(x) for x in global_sums(astuple(mini))))
        plan = split_weights(rows, chunks, self.struct_ids, self.algo.aggregation, mini, world)
        total = max(sum(t.num_trained_tokens for t in trajs), 1)
        for i, mb in enumerate(pad_micro_batches(chunks)):
            chosen = self._rows(trajs, mb)
            if mb.dummy:  # a zero-weight pass: the other ranks still have micro-batches to run
                dummy = [(t, 0.0, False) for t in chosen]
                self._micro_step(dummy, [None], ZERO_WEIGHTS, temperature)
                continue
            mb_items = [items[j] for j in mb.indices]
            weight = sum(t.num_trained_tokens for t in chosen) / total
            metrics = self._micro_step(
                mb_items, [prox[j] for j in mb.indices], plan[i], temperature
            )
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v * weight / updates

    def _micro_step(self, mb, prox, weights: MicroWeights, temperature: float) -> dict[str, float]:
        """Forward passes for one micro-batch, the loss (`self.loss_fn`) at `weights`, backward."""
        trajs, adv = [t for t, _, _ in mb], [a for _, a, _ in mb]
        formed = torch.tensor([f for _, _, f in mb], dtype=torch.bool)
        logp, batch, entropy = self._logp(self.policy, trajs, temperature, entropy=True)
        mask = batch.loss_mask.to(logp.device)
        behaviour = batch.old_logp.to(logp.device)
        proximal = behaviour if prox[0] is None else pad_rows(prox, logp.shape, logp.device)
        structural = reference = None
        if self.anchor_coef:
            ids = batch.input_ids.to(logp.device)
            structural = structural_mask(ids, mask, self.struct_ids, formed.to(logp.device))
        if self.reference is not None and not self.algo.kl_in_reward:
            with torch.no_grad():
                reference = self._logp(self.reference, trajs, temperature)[0].to(logp.device)
        objective = self.loss_fn(
            logp,
            proximal,  # plain ppo: the engine's, its ratio's anchor
            torch.tensor(adv, dtype=torch.float32, device=logp.device),
            mask,
            behaviour_logprobs=behaviour if needs_trainer_logprobs(self.algo.loss) else None,
            structural_mask=structural,
            anchor_coef=self.anchor_coef,
            ref_logprobs=reference,
            entropy=entropy.detach(),  # of the sampling distribution, same pass as logp
            weights=weights,
        )
        metrics = dict(self.loss_fn.metrics)
        if prox[0] is not None:  # the trainer's pre-update log-probs vs the engine's
            metrics |= mismatch_metrics(proximal, behaviour, mask, self.algo.engine_is_cap)
        if self.policy_version == self._fresh_version:
            trainer = proximal if prox[0] is not None else logp.detach()
            self._gaps.append(gap_sums(trainer, behaviour, mask))
        self.manual_backward(objective)
        return metrics

    def _record(self, batch: RolloutBatch, rewards) -> RolloutRecord:
        return RolloutRecord(
            step=batch.step,
            trajectories=batch.trajectories,
            rewards=tuple(rewards),
            group_size=batch.group_size,
            budgets=batch.budgets,
            windows=tuple(s.windows for s in batch.samples),
            durations=batch.durations,
        )

    # ---- evaluation and export ------------------------------------------------------------
    def evaluate_agent(self, samples: Sequence[Sample], greedy: bool = True) -> list[Trajectory]:
        """Greedy held-out rollouts with the current weights, by the DataModule's agent."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer else None
        if not callable(getattr(datamodule, "evaluate", None)):
            raise RuntimeError(
                "GRPOModule.evaluate_agent runs the RolloutDataModule's agent; fit with "
                "datamodule=RolloutDataModule(...)"
            )
        return datamodule.evaluate(self, samples, greedy)

    def export_hf(self, path: str) -> None:
        """The policy in HF format with its processor (what `model.path` / vLLM load); under
        FSDP2 every rank calls it and rank 0 writes the gathered weights."""
        from paravt.parallel.fsdp import export_hf

        if is_lora(self.policy):  # the merged model, and the adapter in `path/adapter`
            export_lora(self.policy, self.processor, path, self.model_path)
            return
        export_hf(self.policy, self.processor, path, self.spec.dtype)  # not the fp32 masters

    def state_dict(self, *args, **kwargs):
        # The frozen reference is rebuilt from model.path at resume; checkpoints hold the
        # trainable state only. Unless a cold start made it a copy of the policy: then it is
        # saved too (one process only: cold start refuses trainer=fsdp).
        state = super().state_dict(*args, **kwargs)
        if self.reference_in_checkpoint:
            return state
        return {k: v for k, v in state.items() if not k.startswith("reference.")}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As `nn.Module.load_state_dict`, except that a checkpoint without the frozen
        reference (the usual case: `state_dict` leaves it out) loads under `strict` too; any
        other key missing or unexpected fails a strict load, naming the keys."""
        saved_reference = any(k.startswith("reference.") for k in state_dict)
        if saved_reference:
            self.reference_in_checkpoint = True
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        if strict:
            check_loaded_keys(result.missing_keys, result.unexpected_keys, saved_reference)
        return result

    def on_save_checkpoint(self, checkpoint) -> None:
        checkpoint["paravt"] = {
            "policy_version": self.policy_version,
            "reward_weights": asdict(self.reward_weights),
            "anchor_coef": self.anchor_coef,
            "rng": rng_state(),
        }

    def on_load_checkpoint(self, checkpoint) -> None:
        saved = checkpoint.get("paravt", {})
        self.resumed_step = int(checkpoint.get("global_step", 0))  # the run summary names it
        self.policy_version = saved.get("policy_version", 0)
        # The engine's weights are not checkpointed: the DataModule syncs them at the next step.
        if "reward_weights" in saved:
            self.reward_weights = RewardWeights(**saved["reward_weights"])
        self.anchor_coef = saved.get("anchor_coef", self.anchor_coef)
        if "rng" in saved:
            set_rng_state(saved["rng"])
