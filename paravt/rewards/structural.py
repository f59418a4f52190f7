"""The token-level parseability anchor of PARA-GRPO (docs/method.md section 4(i)).

The paper writes the anchor as sum over t in struct(o) of log pi_theta(o_t | o_<t): a term on the
log-probabilities of the structural tokens only (closing tags and canonical opening tags), the
ones that collapse under sampling. As a loss to minimise it is

    L_anchor = -coef * ( sum of logp at structural positions ) / ( number of such positions )

(the paper's sum, divided by the batch's count as the PPO term is divided by its tokens), where
positions are structural token ids among the trained tokens (loss mask 1) of well-formed
rollouts, so the anchor reinforces the tags of parseable trajectories only. This is separate from
the string-level anchor bonus inside R_fmt (`format.py`); each has its own weight.

This module deliberately does not compute log-probabilities nor decide well-formedness: the
trainer passes `logp` from its forward pass and a `well_formed` flag per rollout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from paravt.errors import UserError

STRUCTURAL_TAGS: tuple[str, ...] = (
    "</think>",
    "</tool_call>",
    "</answer>",
    "<tool_call>",
    "<answer>",
)


def _token_id_of(tokenizer: Any, tag: str, added: dict[str, int] | None) -> int:
    ids = list(tokenizer.encode(tag, add_special_tokens=False))
    # An added token is matched before BPE runs, so it stays one id in any context; a plain
    # vocabulary entry can merge with its neighbours and would miss positions.
    if len(ids) != 1 or (added is not None and tag not in added):
        raise ValueError(
            f"structural tag {tag!r} is not a single added token of this tokenizer (it encodes "
            f"to {len(ids)} id(s) {ids[:8]}); add it with tokenizer.add_tokens([{tag!r}], "
            "special_tokens=True) and resize the model's embeddings, or drop it from `tags`"
        )
    return int(ids[0])


class AnchorTagError(UserError, ValueError):
    """An `algorithm.anchor_tags` tag that is not one token of the policy's tokenizer: a
    configuration the user fixes (train.py prints it in one line and exits 2)."""


def structural_token_ids(tokenizer: Any, tags: Sequence[str] = STRUCTURAL_TAGS) -> list[int]:
    """The token id of each tag, in order; each must be a single added token of `tokenizer`.

    Real Qwen vocabularies have no `<answer>`/`</answer>` token (and Qwen2.5-VL no `</think>`):
    the error then names the tags of STRUCTURAL_TAGS this tokenizer does have.
    """
    get_added = getattr(tokenizer, "get_added_vocab", None)
    added = dict(get_added()) if callable(get_added) else None
    try:
        return [_token_id_of(tokenizer, tag, added) for tag in tags]
    except ValueError as err:
        usable = [t for t in STRUCTURAL_TAGS if added is None or t in added]
        raise AnchorTagError(
            f"{err}. Tags that are single tokens here: {usable}; set algorithm.anchor_tags to "
            "those (docs/engines.md)"
        ) from None


def structural_mask(
    token_ids: Tensor,  # [N, T] int
    loss_mask: Tensor,  # [N, T] 0/1 or bool
    struct_ids: Sequence[int],
    well_formed: Tensor | None = None,  # [N] bool
) -> Tensor:  # [N, T] bool
    """True at trained positions holding a structural token, in well-formed rollouts only."""
    if token_ids.shape != loss_mask.shape or token_ids.dim() != 2:
        raise ValueError(
            f"token_ids {tuple(token_ids.shape)} and loss_mask {tuple(loss_mask.shape)} must "
            "both be [N, T]"
        )
    ids = torch.as_tensor(list(struct_ids), dtype=token_ids.dtype, device=token_ids.device)
    mask = torch.isin(token_ids, ids) & loss_mask.bool()
    if well_formed is None:
        return mask
    if well_formed.shape != token_ids.shape[:1]:
        raise ValueError(
            f"well_formed {tuple(well_formed.shape)} must be [N] = [{token_ids.shape[0]}], "
            "one flag per rollout"
        )
    return mask & well_formed.bool().to(mask.device)[:, None]


def structural_anchor_loss(
    logp: Tensor,  # [N, T] log pi_theta of each token
    mask: Tensor,  # [N, T] bool, from structural_mask
    coef: float,
) -> Tensor:  # [] scalar
    """-coef * mean of logp over the batch's masked positions (token-mean, as the PPO term, so
    the micro-batch weights of `paravt.rl.microbatch` split it exactly); 0 (with a gradient)
    when there is none."""
    if logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and mask {tuple(mask.shape)} must match")
    mask = mask.bool()
    # where, not multiply: -inf log-probs at unmasked (padding) positions must not become NaN.
    picked = torch.where(mask, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    return -coef * picked.sum() / mask.sum().clamp(min=1)
