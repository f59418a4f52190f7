"""A rollout engine on transformers' `generate`, for CPUs and small GPUs.

All requests of a call are generated in one batched, left-padded `generate`; each is repeated
`n` times. Vision placeholder ids are suppressed (docs/method.md pitfall 6) and the reported
log-probabilities follow the definition in `paravt.rollout.engine`: a logits processor takes
each step's logits, keeps the log-softmax of that one step under the sampling distribution and
gathers the sampled token's log-prob at the next step, so memory holds [N, V] of one step, never
the fp32 logits of every generated token (8 x 2,048 x 151,936 floats is 10 GB). The checkpoint's
generation config is set aside for the call (`neutral_generation_config`): transformers fills
every knob a call leaves unset from it, so its repetition penalty, min-p, typical-p, n-gram bans
or top-k would otherwise reshape the sampling distribution behind the trainer's back (pitfall 8);
the call states the few knobs paravt uses and nothing else applies.

Seeds: the rows of one `generate` share torch's global generator, so a request's tokens depend
on its batch; the generator is seeded per call from all of its requests' seeds (`batch_seed`),
which differ per trajectory and turn (the agent loop's), never reused across ranks or rounds.

It deliberately does not keep a KV cache across agent rounds: each round re-encodes the context.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from paravt.models.qwen_vl import mm_token_type_ids, vision_placeholder_ids, visual_kwargs
from paravt.parallel.distributed import generate_sync_kwargs, load_buckets
from paravt.rollout.engine import (
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    derive_seed,
    request_seeds,
)
from paravt.rollout.engines.sampled_logprobs import SampledLogprobs
from paravt.rollout.sync.weight_sync import iter_weights


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


def batch_seed(seeds: Sequence[int | None]) -> int | None:
    """The one seed of a batched `generate` (transformers draws every row from torch's global
    generator): derived from all the requests' seeds in order, so it changes with the rank's
    share, the step and the round; None when no request is seeded."""
    if all(s is None for s in seeds):
        return None
    return derive_seed(len(seeds), *(-1 if s is None else s for s in seeds))


@contextmanager
def neutral_generation_config(model) -> Iterator[None]:
    """`model`'s generation configs replaced by transformers' neutral defaults while in the block.

    Every module that can `generate` (a LoRA wrapper's inner model included) gets a fresh
    `GenerationConfig`, restored on exit: a value paravt does not pass (repetition_penalty,
    no_repeat_ngram_size, min_p, typical_p, ...) then takes the library's neutral default instead
    of the checkpoint's `generation_config.json`.
    """
    from transformers import GenerationConfig, GenerationMixin

    owners = [m for m in model.modules() if isinstance(m, GenerationMixin)]
    saved = [m.generation_config for m in owners]
    try:
        for m in owners:
            m.generation_config = GenerationConfig()
        yield
    finally:
        for m, cfg in zip(owners, saved, strict=True):
            m.generation_config = cfg


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
        # A copy: `iter_weights` gathers an FSDP2-sharded policy bucket by bucket (every rank
        # calls this) and merges a LoRA one under the base model's names.
        self._check_materialised("receive weights")
        if policy is not self.model:
            device = next(self.model.parameters()).device
            load_buckets(self.model, iter_weights(policy, self.sync_bucket_bytes, device))
        self._version = version

    @torch.no_grad()
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        if not requests:
            return []
        self._check_materialised("generate")
        expanded = [r for r in requests for _ in range(params.n)]
        device = next(self.model.parameters()).device
        ids, mask = left_pad([r.token_ids for r in expanded], self.pad_id)
        kwargs = visual_kwargs([v for r in expanded for v in r.visuals], device)
        seed = batch_seed(request_seeds(requests, params))
        if seed is not None:
            torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        record = SampledLogprobs(params.logprob_temperature, self.suppress_ids)
        with neutral_generation_config(self.model):
            out = self._generate(ids.to(device), mask.to(device), params, record, kwargs)
        self.model.train(was_training)
        new = out.sequences[:, ids.shape[1] :]
        logp = record.finish(new).cpu()  # [N, T_new]
        new = new.cpu()
        results = [self._finish(new[i], logp[i]) for i in range(new.shape[0])]
        return [results[i : i + params.n] for i in range(0, len(results), params.n)]

    def _generate(self, ids, mask, params: SamplingParams, record, visual: dict):
        return self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            mm_token_type_ids=mm_token_type_ids(ids, self.image_id, self.video_id).to(ids.device),
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            temperature=None if params.greedy else 1.0,  # applied by `record`
            top_k=0 if not params.greedy else None,
            top_p=1.0 if not params.greedy else None,
            suppress_tokens=self.suppress_ids,
            logits_processor=[record],
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            **generate_sync_kwargs(self.model),  # sharded: step until every rank is done
            **visual,
        )

    def _check_materialised(self, action: str) -> None:
        """A clear error, not a silent no-op copy or a meta-tensor crash deep in `generate`."""
        from paravt.parallel.distributed import on_meta

        if on_meta(self.model):
            raise RuntimeError(
                f"TransformersEngine cannot {action}: its model is a meta-device skeleton with no "
                "weights (built before FSDP2's configure_model filled the policy); the engine must "
                "be rebuilt on the materialised policy (RolloutDataModule.connect does this)"
            )

    def _finish(self, tokens: torch.Tensor, logp: torch.Tensor) -> GenerationOutput:
        toks = tokens.tolist()
        for j, t in enumerate(toks):
            if t in self.stop_ids:
                return GenerationOutput(tuple(toks[: j + 1]), tuple(logp[: j + 1].tolist()), "stop")
        return GenerationOutput(tuple(toks), tuple(logp.tolist()), "length")
