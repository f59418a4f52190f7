"""One rank of the precision check (finding 3): one AdamW step at lr 2e-6 under three settings.

- `recipe`: what `trainer=fsdp` does on GPU (`paravt.parallel.fsdp.configure_sharding`): the
  checkpoint loaded in bf16 (model.dtype), fp32 master weights (`fp32_master`), FSDP2 with
  `mixed_precision(compute_dtype="bfloat16")` (bf16 compute, fp32 gradient reduction);
- `fp32`: everything fp32, FSDP2 without a policy (the reference share of changed weights);
- `bf16_true`: what Lightning's `precision=bf16-true` did: bf16 parameters and moments.
Each rank writes the share of trainable elements the step changed and the dtypes it saw.
"""

from __future__ import annotations

import torch

LR = 2e-6


def _batch(processor, ids):
    from paravt.types import Trajectory

    trajs = []
    for g in range(4):
        tokens = tuple(10 + (7 * g + 13 * i) % 400 for i in range(24))
        mask = (0,) * 6 + (1,) * 18
        trajs.append(Trajectory("p", g, tokens, mask, (0.0,) * 24, (), 6))
    return trajs


def _one_step(setting: str, model_dir: str) -> dict:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.models.forward import TokenIds, trajectory_logprobs
    from paravt.parallel.distributed import shard_prompts
    from paravt.parallel.fsdp import fp32_master, mixed_precision, shard_policy
    from paravt.rollout.sync.weight_sync import iter_weights

    dtype = torch.float32 if setting == "fp32" else torch.bfloat16
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype)
    model.model.visual.requires_grad_(False)
    processor = AutoProcessor.from_pretrained(model_dir)
    mp = None
    if setting == "recipe":
        fp32_master(model)
        mp = mixed_precision("cpu", "bfloat16")
    shard_policy(model, mixed_precision=mp)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    gathered = [(n, t) for b in iter_weights(model, device="cpu") for n, t in b]
    before = {n: t.float().clone() for n, t in gathered if n in trainable}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    trajs = list(shard_prompts(_batch(processor, ids), rank, world))
    computed = []  # the dtype the forward computes in (the logits themselves never exist whole)
    hook = model.get_input_embeddings().register_forward_hook(
        lambda _m, _i, out: computed.append(out.dtype)
    )
    logp, batch, _ = trajectory_logprobs(model, trajs, ids)
    hook.remove()
    adv = torch.linspace(-1.0, 1.0, len(trajs))[:, None]
    loss = -(logp.float() * adv * batch.loss_mask).sum() / batch.loss_mask.sum()
    loss.backward()
    param = next(p for p in model.parameters() if p.requires_grad)
    seen = {
        "param": param.to_local().dtype,
        "grad": param.grad.to_local().dtype,
        "compute": computed[0],
        "rotary": {n: b.dtype for n, b in model.named_buffers() if "inv_freq" in n},
    }
    opt.step()
    seen["exp_avg"] = opt.state[param]["exp_avg"].to_local().dtype
    gathered = [(n, t) for b in iter_weights(model, device="cpu") for n, t in b]
    after = {n: t.float() for n, t in gathered if n in trainable}
    changed = sum(int((after[n] != before[n]).sum()) for n in before)
    total = sum(before[n].numel() for n in before)
    return {"changed_share": changed / total, "dtypes": seen}


def run(model_dir: str) -> dict:
    return {s: _one_step(s, model_dir) for s in ("recipe", "fp32", "bf16_true")}
