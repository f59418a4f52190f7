"""Supervised fine-tuning on token-exact trajectories: the loss core and the SFT LightningModule.

The loss is the mean negative log-likelihood of the trained (mask-1) tokens, computed with the
same teacher-forced pass the RL trainer uses (same temperature-1 log-softmax, same suppressed
vision placeholders), so SFT and RL see identical token/visual layouts. `SFTModule` trains on
`SFTBatch`es from `paravt.data.sft_datamodule`, packed (`paravt.data.packing`) or padded, with
Lightning's automatic optimisation: gradient accumulation and clipping come from the Trainer,
the LR schedule from `cosine_with_warmup`. It can also wrap an existing policy (`policy=`,
`processor=`), which is how a cold start inside an RL run uses this same code path.
Data parallel (FSDP2 under Lightning's ModelParallelStrategy, `trainer=fsdp`): `configure_model`
shards the policy; each rank's loss is scaled so that FSDP's gradient average is the token mean
over the GLOBAL micro-batch, and a rank whose rows were all bad still runs a zero-weight pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import lightning.pytorch as pl
import torch

from paravt.data.packing import ModelBatch, model_rope_index, pack_batch, pad_batch
from paravt.data.sft_encode import SFTExample
from paravt.data.sft_schema import answer_spans
from paravt.models.forward import TokenIds
from paravt.models.head_logprobs import head_logprobs, shift_head_greedy, shift_head_output
from paravt.models.qwen_vl import visual_kwargs
from paravt.parallel.distributed import Rank, filler_trajectory, global_sum, token_loss_scale
from paravt.progress import track
from paravt.types import Trajectory


def sft_loss(
    logp: torch.Tensor,  # [N, T]
    loss_mask: torch.Tensor,  # [N, T] bool
) -> torch.Tensor:
    """Token-mean negative log-likelihood over trained tokens; 0 when nothing is trained."""
    picked = torch.where(loss_mask, logp, torch.zeros_like(logp))
    return -picked.sum() / loss_mask.sum().clamp(min=1)


def supervised_steps(
    model,
    processor,
    trajectories: Sequence[Trajectory],
    steps: int,
    lr: float = 3e-3,
    batch_size: int = 8,
) -> list[float]:
    """`steps` AdamW steps over `trajectories` (cycled in order) through `SFTModule.fit_steps`;
    return the losses. A shorthand for tests and scripts: the same code path as every SFT."""
    module = SFTModule(
        policy=model,
        processor=processor,
        optimizer=partial(torch.optim.AdamW, lr=lr, weight_decay=0.0),
        packing=False,
    )
    examples = [example_from_trajectory(t, processor.tokenizer) for t in trajectories]
    return [r["loss"] for r in module.fit_steps(examples, steps, batch_size)]


def cosine_with_warmup(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_ratio: float = 0.05,
    min_lr_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup_ratio * total_steps`, then cosine decay to `min_lr_ratio`."""
    if total_steps < 1 or not 0 <= warmup_ratio < 1:
        raise ValueError(
            f"cosine_with_warmup needs total_steps >= 1 and 0 <= warmup_ratio < 1 "
            f"(got {total_steps}, {warmup_ratio})"
        )
    warmup = math.ceil(warmup_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass(frozen=True)
class SFTStats:
    """Losses and answer-token metrics of one batch (tensors keep the graph for `loss`)."""

    loss: torch.Tensor  # scalar, token mean over trained tokens
    per_example: torch.Tensor  # [E] token-mean loss of each example (nan when nothing trained)
    answer_loss: torch.Tensor | None  # scalar over answer tokens, None when none are marked
    answer_accuracy: torch.Tensor | None  # share of answer tokens predicted by argmax


def batch_logprobs(
    model, batch: ModelBatch, ids: TokenIds, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp [R, T], greedy [R, T] bool) of one teacher-forced pass over a (packed) batch.

    Only the trained tokens go through the lm_head, `chunk_size` at a time (logp is 0
    elsewhere; paravt/models/head_logprobs.py); `greedy` says, at the trained answer tokens,
    whether the token is the argmax of its distribution (vision placeholders suppressed)."""
    device = next(model.parameters()).device
    extra = {}
    if batch.attention_mask is not None:
        extra["attention_mask"] = batch.attention_mask.to(device)
    if batch.position_ids is not None:
        extra["position_ids"] = batch.position_ids.to(device)
    input_ids = batch.input_ids.to(device)
    trained = batch.loss_mask
    answer = batch.answer_mask & trained
    with head_logprobs(model, input_ids, 1.0, ids.suppress, chunk_size, False, trained, answer):
        out = model(
            input_ids=input_ids,
            mm_token_type_ids=batch.mm_token_type_ids.to(device),
            use_cache=False,
            **extra,
            **visual_kwargs(batch.visuals, device),
        )
    logp, _ = shift_head_output(out.logits)
    return logp, shift_head_greedy(out.logits)


def sft_stats(
    logp: torch.Tensor,  # [R, T]
    greedy: torch.Tensor,  # [R, T] bool: the token is its distribution's argmax (answers)
    batch: ModelBatch,
    num_examples: int,
) -> SFTStats:
    """Token-mean loss, per-example losses and answer-token loss/accuracy of a batch."""
    dev = logp.device
    mask, answer = batch.loss_mask.to(dev), (batch.answer_mask & batch.loss_mask).to(dev)
    owner = batch.example_ids.to(dev).clamp(min=0)
    nll = torch.where(mask, -logp, torch.zeros_like(logp))
    sums = torch.zeros(num_examples, device=dev).index_add(0, owner.flatten(), nll.flatten())
    counts = torch.zeros(num_examples, device=dev).index_add(
        0, owner.flatten(), mask.flatten().float()
    )
    per_example = sums / counts  # nan for an example with no trained token
    answer_loss = answer_acc = None
    if answer.any():
        answer_loss = -logp[answer].mean()
        answer_acc = greedy.to(dev)[answer].float().mean()
    return SFTStats(sft_loss(logp, mask), per_example.detach(), answer_loss, answer_acc)


def example_from_trajectory(traj: Trajectory, tokenizer) -> SFTExample:
    """An agent-loop trajectory as an SFT example, answer tokens marked.

    Each run of trained tokens (one assistant turn) is decoded and re-tokenised with offsets;
    when that gives back the same ids (always for scripted teachers), the tokens inside
    `<answer>...</answer>` are marked, otherwise none of that run is.
    """
    flags = [0] * len(traj.token_ids)
    t, n = 0, len(traj.token_ids)
    while t < n:
        if not traj.loss_mask[t]:
            t += 1
            continue
        end = t
        while end < n and traj.loss_mask[end]:
            end += 1
        run = list(traj.token_ids[t:end])
        text = tokenizer.decode(run, skip_special_tokens=False)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == run:
            spans = answer_spans(text)
            for j, (lo, hi) in enumerate(enc["offset_mapping"]):
                flags[t + j] = int(any(s < hi and b > lo for s, b in spans))
        t = end
    return SFTExample(traj.sample_id, traj, tuple(flags))


class SFTModule(pl.LightningModule):
    """Cold-start SFT of a Qwen-VL policy on `SFTBatch`es (packed by default)."""

    def __init__(
        self,
        model=None,  # a PolicySpec; ignored when `policy` is given
        optimizer: Callable | None = None,
        scheduler: Callable | None = None,
        packing: bool = True,
        pack_tokens: int = 8192,
        policy=None,
        processor=None,
        init_on_meta: bool = False,  # FSDP2: a meta skeleton until configure_model fills it
        answer_weight: float = 0.0,
    ):
        super().__init__()
        self.spec = model
        if policy is None:
            from paravt.models.loading import load_policy

            policy, processor = load_policy(model, on_meta=init_on_meta)
            policy.train()  # from_pretrained returns eval mode; dropout, if any, must be on
        self.policy, self.processor = policy, processor
        self.optimizer_factory = optimizer or torch.optim.AdamW
        self.scheduler_factory = scheduler
        self.packing, self.pack_tokens = packing, pack_tokens
        # Extra weight of the answer tokens' mean NLL where the data marks answers: in a tool
        # trajectory the answer is a few of ~100 trained tokens, drowned by fixed text and JSON.
        self.answer_weight = answer_weight
        self.token_ids = TokenIds.from_tokenizer(processor.tokenizer)
        self.loss_history: list[float] = []
        self._tick: float | None = None

    def configure_model(self) -> None:
        """FSDP2: shard (and fill from a meta skeleton) the policy; see `GRPOModule`."""
        from paravt.parallel.fsdp import configure_sharding

        configure_sharding(self, self.spec, self.policy)
        self.policy.train()

    def configure_optimizers(self):
        opt = self.optimizer_factory([p for p in self.policy.parameters() if p.requires_grad])
        if self.scheduler_factory is None:
            return opt
        sched = {"scheduler": self.scheduler_factory(opt), "interval": "step"}
        return {"optimizer": opt, "lr_scheduler": sched}

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # tensors are built and moved in `model_batch`

    def model_batch(self, examples: Sequence[SFTExample]) -> ModelBatch:
        ids = self.token_ids
        if self.packing:
            rope = model_rope_index(self.policy)
            return pack_batch(examples, rope, self.pack_tokens, ids.pad, ids.image, ids.video)
        return pad_batch(examples, ids.pad, ids.image, ids.video)

    def compute(self, examples: Sequence[SFTExample]) -> tuple[SFTStats, ModelBatch]:
        batch = self.model_batch(examples)
        logp, greedy = batch_logprobs(self.policy, batch, self.token_ids)
        return sft_stats(logp, greedy, batch, len(examples)), batch

    def objective(self, stats: SFTStats) -> torch.Tensor:
        """What is minimised: the token-mean loss, plus `answer_weight` x the answer loss."""
        if self.answer_weight and stats.answer_loss is not None:
            return stats.loss + self.answer_weight * stats.answer_loss
        return stats.loss

    @torch.no_grad()
    def answer_metrics(
        self, examples: Sequence[SFTExample], chunk: int = 8
    ) -> tuple[float, float] | None:
        """(mean NLL, argmax accuracy) over every marked answer token of `examples`,
        teacher-forced in eval mode; None when no example marks an answer."""
        was_training = self.policy.training
        self.policy.eval()
        nll = hits = count = 0.0
        for start in range(0, len(examples), chunk):
            stats, batch = self.compute(examples[start : start + chunk])
            n = float((batch.answer_mask & batch.loss_mask).sum())
            if stats.answer_loss is not None:
                nll += float(stats.answer_loss) * n
                hits += float(stats.answer_accuracy) * n
                count += n
        self.policy.train(was_training)
        return (nll / count, hits / count) if count else None

    def training_step(self, batch, batch_idx):
        if hasattr(self.trainer.datamodule, "on_batch_consumed"):
            self.trainer.datamodule.on_batch_consumed(batch)
        metrics = {"data/skipped_rows": float(len(batch.skipped))}
        world = Rank.current().world_size
        if not batch.examples and world == 1:
            self.log_dict(metrics, batch_size=1)
            return None  # every row of this micro-batch was bad: no step, no crash
        if not batch.examples:  # the other ranks' passes are collectives: join with weight 0
            stats, _ = self.compute([self._dummy_example()])
            global_sum(0.0)  # the token count every rank contributes below
            self.log_dict(metrics, batch_size=1)
            return stats.loss * 0.0
        stats, mb = self.compute(batch.examples)
        loss = self.objective(stats)
        n = len(batch.examples)
        scale = 1.0
        if world > 1:  # the token mean over every rank's micro-batch, once FSDP averages
            trained = int(mb.loss_mask.sum())
            scale = token_loss_scale(trained, global_sum(trained), world)
        metrics |= {"train/loss": stats.loss.item(), "train/tokens": float(mb.num_tokens)}
        if stats.answer_loss is not None:
            metrics["train/answer_loss"] = stats.answer_loss.item()
            metrics["train/answer_accuracy"] = stats.answer_accuracy.item()
        metrics["train/lr"] = self.trainer.optimizers[0].param_groups[0]["lr"]
        self.log_dict(metrics, on_step=True, batch_size=n)
        self.log("loss", stats.loss.item(), prog_bar=True, batch_size=n)
        self.loss_history.append(stats.loss.item())
        self._tokens = mb.num_tokens
        return loss * scale

    def _dummy_example(self) -> SFTExample:
        traj = filler_trajectory(self.processor.tokenizer.pad_token_id)
        return SFTExample(traj.sample_id, traj, (0, 0))

    def on_train_batch_start(self, batch, batch_idx) -> None:
        self._tick = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self._tick is not None and batch.examples:
            rate = self._tokens / max(time.perf_counter() - self._tick, 1e-9)
            self.log("train/tokens_per_s", rate, on_step=True, batch_size=len(batch.examples))

    def fit_steps(
        self,
        examples: Sequence[SFTExample],
        steps: int,
        batch_size: int,
        *,
        lead: Sequence[SFTExample] = (),
        lead_steps: int = 0,
        max_grad_norm: float | None = None,
        on_step: Callable[[int], None] | None = None,
        desc: str = "SFT step",
    ) -> list[dict[str, float]]:
        """`steps` optimiser steps outside a Trainer, with the same loss and metrics as
        `training_step`: how a cold start inside an RL run uses this module.

        Batches cycle over `examples` in order; the first `lead_steps` steps cycle over `lead`
        instead (a curriculum). `on_step(done)` runs after every step (measurements).
        """
        params = [p for p in self.policy.parameters() if p.requires_grad]
        opt = self.optimizer_factory(params)
        sched = self.scheduler_factory(opt) if self.scheduler_factory else None
        self.policy.train()
        records = []
        for step in track(range(steps), desc=desc):
            pool = lead if lead and step < lead_steps else examples
            start = step * batch_size
            batch = [pool[(start + i) % len(pool)] for i in range(batch_size)]
            stats, _ = self.compute(batch)
            loss = self.objective(stats)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            opt.step()
            if sched is not None:
                sched.step()
            rec = {"loss": loss.item(), "token_loss": stats.loss.item()}
            if stats.answer_loss is not None:
                rec["answer_loss"] = stats.answer_loss.item()
                rec["answer_accuracy"] = stats.answer_accuracy.item()
            records.append(rec)
            if on_step is not None:
                on_step(step + 1)
        self.loss_history += [r["loss"] for r in records]
        self.policy.eval()
        return records

    def export_hf(self, path: str) -> None:
        """The policy in HF format with its processor (what `model.path` / vLLM load); under
        FSDP2 every rank calls it and rank 0 writes the gathered weights."""
        from paravt.parallel.fsdp import export_hf

        export_hf(self.policy, self.processor, path, self.spec.dtype)  # not the fp32 masters
