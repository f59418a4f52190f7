"""GRPOModule: the LightningModule of PARA-GRPO (rollout -> reward -> advantage -> update -> sync).

Rollouts are generated inside `training_step` with the weights after update t-1 (the engine is
synced at the start of the step), so Lightning's one-batch prefetch, which only reads prompts,
cannot make them stale; the engine's weight version is recorded with every batch, and
`rollout.max_staleness` lets it lag on purpose. Optimisation is manual: PPO epochs x mini-batches
of optimiser steps, gradients accumulated over micro-batches of a padded-token budget, clipped.
The arithmetic lives in the pure core (`paravt.rl`, `paravt.rewards`); this file sequences it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import lightning.pytorch as pl
import torch

from callbacks.records import RolloutRecord
from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.tools import CropConfig
from paravt.models.loading import PolicySpec, load_policy
from paravt.modules.forward import TokenIds, trajectory_logprobs
from paravt.modules.runtime import PhaseTimer, grad_norm, pad_rows, rng_state, set_rng_state
from paravt.rewards.compose import RewardWeights, is_well_formed, trajectory_reward
from paravt.rewards.structural import (
    STRUCTURAL_TAGS,
    structural_anchor_loss,
    structural_mask,
    structural_token_ids,
)
from paravt.rl.kl import kl_penalty
from paravt.rl.losses import entropy_from_logits, get_policy_loss, kl_loss
from paravt.rl.microbatch import MicroWeights, max_response_tokens, split_weights
from paravt.rl.objective import (
    AdvantageConfig,
    advantage_metrics,
    compute_advantages,
    rollout_metrics,
    split_even,
    token_budget_chunks,
)
from paravt.rollout.engine import SamplingParams
from paravt.rollout.hf import TransformersEngine
from paravt.types import RewardBreakdown, Sample, Trajectory
from paravt.video.reader import VideoReader


@dataclass(frozen=True)
class RolloutConfig:
    """Grouped sampling: G rollouts per prompt at `temperature`, with the agent and crop tool."""

    group_size: int = 8
    temperature: float = 0.7
    default_budget: int = 8
    max_staleness: int = 0  # rollouts may use weights this many updates old (decoupled loss)
    agent: AgentConfig = field(default_factory=AgentConfig)
    crop: CropConfig | None = None


@dataclass(frozen=True)
class AlgorithmConfig:
    """The policy objective: loss variant, clipping, KL, structural anchor, PPO schedule."""

    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    iw_cap: float | None = 5.0
    aggregation: str = "token_mean"
    # Dr.GRPO's constant divisor (seq_mean_token_sum_norm); None: the maximum response length,
    # rollout.agent.max_new_tokens x (max_rounds + 1).
    norm_length: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k1"
    kl_in_reward: bool = True
    anchor_coef: float = 0.0
    anchor_tags: tuple[str, ...] = STRUCTURAL_TAGS
    ppo_epochs: int = 1
    ppo_mini_batches: int = 1  # optimiser steps per PPO epoch
    micro_batch_tokens: int = 16384  # padded tokens per gradient micro-batch
    max_grad_norm: float = 1.0
    train_subagents: bool = False


class GRPOModule(pl.LightningModule):
    """Policy (+ frozen reference when KL is on), the agent loop and the PARA-GRPO update."""

    def __init__(
        self,
        model: PolicySpec,
        rollout: RolloutConfig,
        algorithm: AlgorithmConfig,
        reward: RewardWeights,
        optimizer: Callable,
        seed: int = 0,
        scheduler: Callable | None = None,
    ):
        super().__init__()
        self.automatic_optimization = False
        self.spec, self.rollout_cfg, self.algo = model, rollout, algorithm
        self.reward_weights = reward
        self.anchor_coef = algorithm.anchor_coef
        self.norm_length = algorithm.norm_length or max_response_tokens(
            rollout.agent.max_new_tokens, rollout.agent.max_rounds
        )
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.seed = seed
        self.policy, self.processor = load_policy(model)
        self.reference = None
        if algorithm.kl_coef > 0:
            self.reference = copy.deepcopy(self.policy).requires_grad_(False).eval()
        tok = self.processor.tokenizer
        self.token_ids = TokenIds.from_tokenizer(tok)
        # Checked up front (a clear error naming the tag) whenever the anchor can be used.
        self.struct_ids = structural_token_ids(tok, algorithm.anchor_tags)
        # With staleness allowed the engine samples from its own copy of the weights, synced
        # only when they would fall more than `max_staleness` updates behind.
        engine_model = self.policy if rollout.max_staleness == 0 else copy.deepcopy(self.policy)
        self.engine = TransformersEngine(engine_model, tok)
        self.policy_version = 0  # optimiser updates applied to the policy
        renderer = ChatRenderer(self.processor)
        crop = rollout.crop or CropConfig(factor=renderer.frame_factor)
        self.agent = AgentLoop(self.engine, renderer, VideoReader(), rollout.agent, crop)
        self.last_rollout: RolloutRecord | None = None
        self.rollout_versions: list[tuple[int, int]] = []  # (step, weight version) per batch
        self.seen_prompts: list[tuple[int, tuple[str, ...]]] = []  # (step, prompt ids)
        self.reward_history: list[tuple[int, float]] = []  # (step, mean reward)
        self._staleness = 0
        self._reference_kl = 0.0

    def reset_reference(self) -> None:
        """Make the frozen reference a copy of the current policy (e.g. after a cold start)."""
        if self.reference is not None:
            self.reference.load_state_dict(self.policy.state_dict())

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # prompts hold no tensors; rollouts are built on the policy's device

    def configure_optimizers(self):
        opt = self.optimizer_factory([p for p in self.policy.parameters() if p.requires_grad])
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": self.scheduler_factory(opt)}

    # ---- the step, as phases ----------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        timer = PhaseTimer()
        samples, step = list(batch.samples), batch.step
        budgets = self._budgets(samples, batch.epoch)
        with timer("sync"):
            self._sync_engine()
        with timer("rollout"):
            trajs = self._rollout(samples, budgets, step)
        with timer("reward"):
            rewards = [self.score(t, s) for t, s in zip(trajs, self._repeat(samples), strict=True)]
        with timer("logprobs"):
            totals = self._rewards_with_kl(trajs, rewards)
        adv = compute_advantages(totals.view(len(samples), -1), self.algo.advantage)
        with timer("update"):
            formed = [is_well_formed(r) for r in rewards]
            update = self._update(trajs, adv.values, adv.keep, formed)
        self.last_rollout = self._record(step, trajs, rewards, samples, budgets)
        if hasattr(self.trainer.datamodule, "on_batch_consumed"):
            self.trainer.datamodule.on_batch_consumed(batch)
        metrics = rollout_metrics(trajs, rewards, budgets, self.rollout_cfg.group_size)
        metrics |= update | timer.metrics() | advantage_metrics(adv)
        metrics |= {f"time/rollout_{k}": v for k, v in self.agent.timings.items()}
        metrics["rollout/staleness"] = float(self._staleness)
        if self.reference is not None and self.algo.kl_in_reward:
            metrics["kl/reference"] = self._reference_kl
        metrics["weight_version"] = float(self.rollout_versions[-1][1])
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=len(trajs))
        self.log("reward", metrics["reward/mean"], prog_bar=True, batch_size=len(trajs))
        self.reward_history.append((step, metrics["reward/mean"]))
        return None

    def _sync_engine(self) -> None:
        """Give the engine the current weights when they would otherwise be too stale."""
        if self.policy_version - self.engine.weight_version > self.rollout_cfg.max_staleness:
            self.engine.sync_weights(self.policy, self.policy_version)

    def _budgets(self, samples: Sequence[Sample], epoch: int) -> list[int]:
        dm = getattr(self.trainer, "datamodule", None)
        sampler = getattr(dm, "budget_sampler", None)
        if sampler is None:
            return [self.rollout_cfg.default_budget] * len(samples)
        return [int(sampler(s.id, epoch)) for s in samples]

    def _rollout(self, samples, budgets, step: int) -> list[Trajectory]:
        self.rollout_versions.append((step, self.engine.weight_version))
        self._staleness = self.policy_version - self.engine.weight_version
        self.seen_prompts.append((step, tuple(s.id for s in samples)))
        params = SamplingParams(
            temperature=self.rollout_cfg.temperature, seed=self.seed * 100_003 + step
        )
        return self.agent.run(samples, budgets, self.rollout_cfg.group_size, params)

    def _repeat(self, samples: Sequence[Sample]) -> list[Sample]:
        return [s for s in samples for _ in range(self.rollout_cfg.group_size)]

    def score(self, traj: Trajectory, sample: Sample) -> RewardBreakdown:
        return trajectory_reward(traj, sample, self.reward_weights)

    def _rewards_with_kl(self, trajs, rewards) -> torch.Tensor:
        """R - kl_coef * KL(sampling policy || reference) per rollout (reward-side KL).

        The sampling policy's log-probs are the behaviour log-probs the engine returned, so only
        the reference needs a forward pass.
        """
        totals = torch.tensor([r.total for r in rewards], dtype=torch.float32)
        if self.reference is None or not self.algo.kl_in_reward:
            return totals
        kls = []
        with torch.no_grad():
            for chunk in self._chunks(trajs):
                mb = [trajs[i] for i in chunk]
                ref, batch, _ = self._logp(self.reference, mb)
                behaviour = batch.old_logp.to(ref.device)
                mask = batch.loss_mask.to(ref.device)
                per_token = kl_penalty(behaviour, ref, self.algo.kl_estimator, mask)
                kls.append(per_token.sum(-1).cpu())
        seq_kl = torch.cat(kls)
        self._reference_kl = float(seq_kl.mean())
        return totals - self.algo.kl_coef * seq_kl

    def _logp(self, model, trajs, logits: bool = False):
        return trajectory_logprobs(
            model, trajs, self.token_ids, self.rollout_cfg.temperature, return_logits=logits
        )

    # ---- the update -------------------------------------------------------------------------
    def _update(self, trajs, adv: torch.Tensor, keep: torch.Tensor, formed) -> dict[str, float]:
        """PPO epochs x mini-batches of optimiser steps over the kept (trajectory, advantage,
        well-formed) items; sub-agent rollouts join with their main trajectory's advantage."""
        rows = zip(trajs, adv.tolist(), keep.tolist(), formed, strict=True)
        items = [(t, a, f) for t, a, k, f in rows if k]
        if self.algo.train_subagents:
            # PARAVT.md pitfall 4; sub-agent text has no structural tags to anchor.
            items += [(s, a, False) for t, a, _ in list(items) for s in t.sub_trajectories]
        prox = self._proximal_logprobs([t for t, _, _ in items])
        opt = self.optimizers()
        sums: dict[str, float] = {}
        updates = self.algo.ppo_epochs * self.algo.ppo_mini_batches
        # An empty batch (every group dropped as zero-variance) still takes one (no-op) step, so
        # the step count, the checkpoints and the data position keep moving together.
        minis = split_even(list(range(len(items))), self.algo.ppo_mini_batches) or [[]]
        for _ in range(self.algo.ppo_epochs):
            for mini in minis:
                self._mini_step([items[i] for i in mini], [prox[i] for i in mini], sums, updates)
                self.clip_gradients(opt, gradient_clip_val=self.algo.max_grad_norm)
                sums["grad_norm"] = grad_norm(self.policy)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if self.scheduler_factory is not None:
                    self.lr_schedulers().step()
                self.policy_version += 1
        sums["update/trajectories"] = float(len(items))
        return sums

    def _proximal_logprobs(self, trajs) -> list[torch.Tensor | None]:
        """pi_prox for the decoupled loss: the policy before this update, one pass, no grad."""
        if self.algo.loss != "decoupled_ppo":
            return [None] * len(trajs)
        out: list[torch.Tensor | None] = [None] * len(trajs)
        with torch.no_grad():
            for chunk in self._chunks(trajs):
                logp, _, _ = self._logp(self.policy, [trajs[i] for i in chunk])
                for row, i in enumerate(chunk):
                    out[i] = logp[row, : len(trajs[i].token_ids)].detach()
        return out

    def _chunks(self, trajs) -> list[list[int]]:
        """Indices of `trajs` in micro-batches of the configured padded-token budget."""
        lengths = [len(t.token_ids) for t in trajs]
        return token_budget_chunks(lengths, self.algo.micro_batch_tokens)

    def _mini_step(self, items, prox, sums: dict[str, float], updates: int) -> None:
        # Each loss term of a micro-batch is weighted by its share of that term's divisor over
        # the mini-batch (paravt.rl.microbatch), so the accumulated gradient is the mini-batch's
        # whatever the cut; metrics are averaged by trained-token share.
        total = max(sum(t.num_trained_tokens for t, _, _ in items), 1)
        chunks = self._chunks([t for t, _, _ in items])
        rows = [(t.token_ids, t.loss_mask, f) for t, _, f in items]
        plan = split_weights(rows, chunks, self.struct_ids, self.algo.aggregation)
        for chunk, weights in zip(chunks, plan, strict=True):
            mb = [items[i] for i in chunk]
            weight = sum(t.num_trained_tokens for t, _, _ in mb) / total
            metrics = self._micro_step(mb, [prox[i] for i in chunk], weights)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v * weight / updates

    def _micro_step(self, mb, prox, weights: MicroWeights) -> dict[str, float]:
        trajs, adv = [t for t, _, _ in mb], [a for _, a, _ in mb]
        formed = torch.tensor([f for _, _, f in mb], dtype=torch.bool)
        logp, batch, logits = self._logp(self.policy, trajs, logits=True)
        mask = batch.loss_mask.to(logp.device)
        behaviour = batch.old_logp.to(logp.device)
        proximal = behaviour if prox[0] is None else pad_rows(prox, logp.shape, logp.device)
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
        a = torch.tensor(adv, dtype=torch.float32, device=logp.device)
        loss, m = get_policy_loss(self.algo.loss)(
            logp,
            proximal,
            behaviour,
            a,
            mask,
            self.algo.clip_low,
            self.algo.clip_high,
            iw_cap=self.algo.iw_cap,
            agg=self.algo.aggregation,
            norm_length=self.norm_length,
            entropy=entropy,
        )
        objective = weights.policy * loss
        metrics = {f"loss/{k}": float(v) for k, v in m.as_dict().items()}
        gap = torch.where(mask, (logp.detach() - behaviour).abs(), torch.zeros_like(behaviour))
        metrics["loss/logprob_gap"] = float(gap.sum() / mask.sum().clamp(min=1))
        if self.anchor_coef:
            smask = structural_mask(
                batch.input_ids.to(logp.device), mask, self.struct_ids, formed.to(logp.device)
            )
            anchor = structural_anchor_loss(logp, smask, self.anchor_coef)
            objective = objective + weights.anchor * anchor
            metrics["loss/anchor"] = float(anchor.detach())
        if self.reference is not None and not self.algo.kl_in_reward:
            with torch.no_grad():
                ref, _, _ = self._logp(self.reference, trajs)
            kl = kl_loss(logp, ref.to(logp.device), mask, self.algo.kl_estimator, self.algo.kl_coef)
            objective = objective + weights.kl * kl
            metrics["loss/kl"] = float(kl.detach())
        self.manual_backward(objective)
        return metrics

    def _record(self, step, trajs, rewards, samples, budgets) -> RolloutRecord:
        return RolloutRecord(
            step=step,
            trajectories=tuple(trajs),
            rewards=tuple(rewards),
            group_size=self.rollout_cfg.group_size,
            budgets=tuple(budgets),
            windows=tuple(s.windows for s in samples),
            durations=tuple(self.agent.source.info(s.video).duration for s in samples),
        )

    # ---- evaluation and export ------------------------------------------------------------
    def evaluate_agent(self, samples: Sequence[Sample], greedy: bool = True) -> list[Trajectory]:
        budgets = [self.rollout_cfg.default_budget] * len(samples)
        params = SamplingParams(greedy=greedy, temperature=self.rollout_cfg.temperature)
        return self.agent.run(samples, budgets, 1, params)

    def export_hf(self, path: str) -> None:
        """Write the policy in HF format (loadable by transformers and vLLM) with its processor."""
        self.policy.save_pretrained(path)
        self.processor.save_pretrained(path)

    def state_dict(self, *args, **kwargs):
        # The reference is frozen and rebuilt from the checkpoint path; keep checkpoints lean.
        state = super().state_dict(*args, **kwargs)
        return {k: v for k, v in state.items() if not k.startswith("reference.")}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return super().load_state_dict(state_dict, strict=False, assign=assign)

    def on_save_checkpoint(self, checkpoint) -> None:
        checkpoint["paravt"] = {
            "weight_version": self.engine.weight_version,
            "policy_version": self.policy_version,
            "reward_weights": asdict(self.reward_weights),
            "anchor_coef": self.anchor_coef,
            "rng": rng_state(),
        }

    def on_load_checkpoint(self, checkpoint) -> None:
        saved = checkpoint.get("paravt", {})
        self.policy_version = saved.get("policy_version", 0)
        # The engine's own weights are not checkpointed: it restarts from the policy's.
        self.engine.sync_weights(self.policy, self.policy_version)
        if "reward_weights" in saved:
            self.reward_weights = RewardWeights(**saved["reward_weights"])
        self.anchor_coef = saved.get("anchor_coef", self.anchor_coef)
        if "rng" in saved:
            set_rng_state(saved["rng"])
