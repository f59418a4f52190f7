"""A rollout engine on transformers' `generate`, for CPUs and small GPUs.

All requests of a call are generated in one batched, left-padded `generate`; each is repeated
`n` times. Vision placeholder ids are suppressed (PARAVT.md pitfall 6) and the reported
log-probabilities follow the definition in `paravt.rollout.engine` (computed from the raw logits
with `paravt.rl.logprobs.token_logprobs`, the same function the trainer uses). top-k and top-p
are explicitly disabled so the generation config of a checkpoint cannot truncate the sampling
distribution behind the trainer's back (pitfall 8).

It deliberately does not keep a KV cache across agent rounds: each round re-encodes the context.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paravt.distributed import (
    generate_sync_kwargs,
    is_sharded,
    iter_full_state_dict,
    load_buckets,
)
from paravt.rl.logprobs import token_logprobs
from paravt.rollout.engine import GenerationOutput, GenerationRequest, SamplingParams
from paravt.types import Visual


def vision_placeholder_ids(tokenizer) -> list[int]:
    """Ids that must never be sampled: image/video pads and the vision block delimiters."""
    names = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    ids = [tokenizer.convert_tokens_to_ids(n) for n in names]
    return [i for i in ids if i is not None and i != tokenizer.unk_token_id]


def mm_token_type_ids(input_ids: torch.Tensor, image_id: int, video_id: int) -> torch.Tensor:
    """Modality of every token as Qwen-VL's M-RoPE expects it: text 0, image 1, video 2."""
    return (input_ids == image_id).long() + 2 * (input_ids == video_id).long()


def visual_kwargs(visuals: Sequence[Visual], device: torch.device | str) -> dict:
    """Model kwargs for the clips of a batch, concatenated in the order their tokens appear."""
    if not visuals:
        return {}
    out = {
        "pixel_values_videos": torch.cat([v.pixel_values_videos for v in visuals]).to(device),
        "video_grid_thw": torch.cat([v.video_grid_thw for v in visuals]).to(device),
    }
    if all(v.second_per_grid_ts is not None for v in visuals):
        out["second_per_grid_ts"] = torch.tensor([v.second_per_grid_ts for v in visuals])
    return out


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, T] ids, [N, T] attention mask), padded on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


class TransformersEngine:
    """`RolloutEngine` over a transformers Qwen-VL model living in this process."""

    def __init__(
        self,
        model,
        tokenizer,
        stop_tokens: Sequence[str] = ("<|im_end|>",),
        sync_bucket_bytes: int = 256 << 20,
    ):
        self.model = model
        self.sync_bucket_bytes = sync_bucket_bytes
        self.tokenizer = tokenizer
        self.suppress_ids = vision_placeholder_ids(tokenizer)
        self.stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in stop_tokens]
        self.pad_id = tokenizer.pad_token_id
        self.image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.video_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")
        self._version = 0

    @property
    def weight_version(self) -> int:
        return self._version

    def sync_weights(self, policy, version: int) -> None:
        # Same process, same module: the weights are already shared; only the version moves.
        # A copy: from an FSDP2-sharded policy, gathered bucket by bucket (every rank calls this).
        if policy is not self.model and is_sharded(policy):
            device = next(self.model.parameters()).device
            load_buckets(self.model, iter_full_state_dict(policy, self.sync_bucket_bytes, device))
        elif policy is not self.model:
            from paravt.models.lora import is_lora, merged_state_dict

            merged = is_lora(policy)  # LoRA: base + adapters, under the base model's names
            self.model.load_state_dict(merged_state_dict(policy) if merged else policy.state_dict())
        self._version = version

    @torch.no_grad()
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        if not requests:
            return []
        expanded = [r for r in requests for _ in range(params.n)]
        device = next(self.model.parameters()).device
        ids, mask = left_pad([r.token_ids for r in expanded], self.pad_id)
        kwargs = visual_kwargs([v for r in expanded for v in r.visuals], device)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            mm_token_type_ids=mm_token_type_ids(ids, self.image_id, self.video_id).to(device),
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            temperature=None if params.greedy else params.temperature,
            top_k=0 if not params.greedy else None,
            top_p=1.0 if not params.greedy else None,
            suppress_tokens=self.suppress_ids,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
            **generate_sync_kwargs(self.model),  # sharded: step until every rank is done
            **kwargs,
        )
        self.model.train(was_training)
        new = out.sequences[:, ids.shape[1] :].cpu()
        logits = torch.stack(out.logits, dim=1).float().cpu()  # [N, T_new, V]
        logp = token_logprobs(logits, new, params.logprob_temperature, self.suppress_ids)
        results = [self._finish(new[i], logp[i]) for i in range(new.shape[0])]
        return [results[i : i + params.n] for i in range(0, len(results), params.n)]

    def _finish(self, tokens: torch.Tensor, logp: torch.Tensor) -> GenerationOutput:
        toks = tokens.tolist()
        for j, t in enumerate(toks):
            if t in self.stop_ids:
                return GenerationOutput(tuple(toks[: j + 1]), tuple(logp[: j + 1].tolist()), "stop")
        return GenerationOutput(tuple(toks), tuple(logp.tolist()), "length")
