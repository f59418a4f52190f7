"""LoRA GRPOModule under FSDP2 (`worker.py lora MODEL_DIR OUT BATCHES`): one rank's run.

A few PARA-GRPO steps of GRPOModule with rank-4 adapters and the KL reference on (the policy
with adapters off), through Lightning's ModelParallelStrategy on W CPU ranks over gloo (plain
Lightning on one). After training each rank reports the gathered weights (adapters and base),
the step metrics, a Lightning checkpoint's keys (and writes the HF export to OUT/hf), and what
the engines received: a fresh
transformers engine copy (`engine_copy`) and a plain base model synced with `sync_weights`,
with their log-probs next to the sharded policy's on the same trajectories.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch

LORA = {"rank": 4, "alpha": 8.0}
LR = 1e-3


def run(model_dir: str, out: Path, batches_path: Path) -> dict:
    import worker  # tests/distributed, this script's folder

    from paravt.models.loading import PolicySpec
    from paravt.modules.grpo import GRPOModule
    from paravt.rewards.compose import RewardWeights
    from paravt.rl.algorithm import AlgorithmConfig
    from paravt.rl.objective import AdvantageConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    batches = torch.load(batches_path, weights_only=False)
    algo = AlgorithmConfig(
        AdvantageConfig(shaping=False, batch_norm=False),
        kl_coef=0.05,
        anchor_coef=0.1,
        micro_batch_tokens=2048,
    )
    spec = PolicySpec(path=model_dir, lora=LORA)
    opt = partial(torch.optim.AdamW, lr=LR)
    module = GRPOModule(spec, algo, RewardWeights(), opt, init_on_meta=world > 1)

    trainer, record = worker.fit_on_ranks(module, batches, world, out)
    res = {"weights": worker.full_weights(module.policy), "metrics": record.metrics}
    res["sharded"] = worker._local(module.policy) < sum(
        p.numel() for p in module.policy.parameters()
    )
    res["trainable"] = sorted(n for n, p in module.policy.named_parameters() if p.requires_grad)
    res |= _engines(module, model_dir, batches[0].trajectories[:4])
    res["checkpoint_keys"] = _checkpoint_keys(trainer, out / "last.ckpt")
    module.export_hf(str(out / "hf"))  # every rank gathers, rank 0 writes
    return res


def _engines(module, model_dir: str, trajs) -> dict:
    """The weights and log-probs of an engine copy and of a synced base model, next to the
    (sharded) policy's log-probs on `trajs`."""
    import worker  # tests/distributed, this script's folder

    from paravt.models.forward import TokenIds, trajectory_logprobs
    from paravt.rollout.engine import EngineConfig
    from paravt.rollout.engines.hf import TransformersEngine
    from paravt.rollout.factory import engine_copy

    tok = module.processor.tokenizer
    copy = engine_copy(module.policy, EngineConfig(sync_bucket_mb=1))
    base, _ = worker.load(model_dir)
    synced = TransformersEngine(base, tok, sync_bucket_bytes=64 << 10)
    synced.sync_weights(module.policy, version=7)
    ids = TokenIds.from_tokenizer(tok)
    logp = {}
    with torch.no_grad():
        for name, model in (("policy", module.policy), ("copy", copy), ("synced", base)):
            model.eval()
            lp, batch, _ = trajectory_logprobs(model, list(trajs), ids, 1.0)
            logp[name] = torch.where(batch.loss_mask, lp, torch.zeros_like(lp))
    return {
        "engine_copy": {k: v.clone() for k, v in copy.state_dict().items()},
        "engine_synced": {k: v.clone() for k, v in base.state_dict().items()},
        "engine_version": synced.weight_version,
        "logp": logp,
    }


def _checkpoint_keys(trainer, path: Path) -> list[str]:
    """The tensor keys of a Lightning checkpoint the trainer writes (sharded: a DCP folder)."""
    trainer.save_checkpoint(str(path))
    if path.is_dir():
        from torch.distributed.checkpoint import FileSystemReader

        return sorted(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    state = torch.load(path, weights_only=False, map_location="cpu")
    return sorted(f"state_dict.{k}" for k in state["state_dict"])
