"""Micro-batch weights that make gradient accumulation exact for every loss aggregation.

A mini-batch (one optimiser step) is cut into micro-batches to fit memory; each micro-batch's loss
is a mean over ITS rows or tokens. Scaling it by `size(micro) / size(mini)`, where size is the
aggregation's own divisor, turns the sum of the scaled losses into the loss of the whole
mini-batch, so the accumulated gradient does not depend on where the cuts fall:

    token_mean               divisor = trained tokens               (weight = token share)
    seq_mean_token_mean      divisor = non-empty rows               (weight = row share)
    seq_mean_token_sum_norm  divisor = non-empty rows x norm_length (weight = row share, with
                             norm_length a CONSTANT, the maximum response length, never the
                             micro-batch's padded length)

Each term of the objective has its own divisor: the policy loss the configured aggregation's,
the KL loss trained tokens, the structural anchor its structural positions. A single token-share
weight (what the trainer used before) is exact for token-mean only.

`token_budget_chunks` cuts a batch into micro-batches of a padded-token budget and `split_even`
into PPO mini-batches. This module deliberately computes no loss and runs no model: counts in,
weights out (the loss is `paravt.rl.paragrpo_loss.PARAGRPOLoss`, called with them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ROW_AGGREGATIONS = frozenset({"seq_mean_token_mean", "seq_mean_token_sum_norm"})


@dataclass(frozen=True)
class TermSizes:
    """The divisors of the objective's terms over some rows (a micro- or a mini-batch)."""

    tokens: int  # trained tokens (loss mask 1)
    rows: int  # rows with at least one trained token
    structural: int  # trained structural-token positions of well-formed rows

    def policy(self, aggregation: str) -> int:
        """The policy loss's divisor under `aggregation` (norm_length cancels in the ratio)."""
        return self.rows if aggregation in ROW_AGGREGATIONS else self.tokens


@dataclass(frozen=True)
class MicroWeights:
    """Multipliers of one micro-batch's mean-form loss terms before backward."""

    policy: float
    kl: float
    anchor: float


def term_sizes(
    loss_masks: Sequence[Sequence[int]],  # one loss mask per row
    structural_counts: Sequence[int] | None = None,  # structural positions per row
) -> TermSizes:
    """The sizes of `loss_masks`' rows (structural positions 0 when not given)."""
    counts = [sum(1 for m in mask if m) for mask in loss_masks]
    return TermSizes(
        tokens=sum(counts),
        rows=sum(c > 0 for c in counts),
        structural=sum(structural_counts or ()),
    )


def micro_weights(micro: TermSizes, mini: TermSizes, aggregation: str) -> MicroWeights:
    """`size(micro) / size(mini)` per term; 0 for a term with nothing to average in the mini."""

    def share(part: int, whole: int) -> float:
        return part / whole if whole > 0 else 0.0

    return MicroWeights(
        policy=share(micro.policy(aggregation), mini.policy(aggregation)),
        kl=share(micro.tokens, mini.tokens),
        anchor=share(micro.structural, mini.structural),
    )


def structural_count(
    token_ids: Sequence[int], loss_mask: Sequence[int], struct_ids: Sequence[int], formed: bool
) -> int:
    """Trained positions holding a structural token, 0 for a row that is not well formed (the
    row-level count of `paravt.rewards.structural.structural_mask`)."""
    if not formed:
        return 0
    ids = set(struct_ids)
    return sum(1 for t, m in zip(token_ids, loss_mask, strict=False) if m and t in ids)


def max_response_tokens(max_new_tokens: int, max_rounds: int) -> int:
    """The most tokens the policy can write in one trajectory: one turn per tool round plus the
    answer turn. The Dr.GRPO divisor when `norm_length` is not configured."""
    if max_new_tokens < 1 or max_rounds < 0:
        raise ValueError(
            f"need max_new_tokens >= 1 and max_rounds >= 0, got {max_new_tokens}, {max_rounds}"
        )
    return max_new_tokens * (max_rounds + 1)


Row = tuple[Sequence[int], Sequence[int], bool]
"""(token_ids, loss_mask, well_formed) of one trajectory of the mini-batch."""


def mini_sizes(rows: Sequence[Row], struct_ids: Sequence[int]) -> TermSizes:
    """The term divisors of `rows` (one rank's share of a mini-batch, or all of it)."""
    structural = [structural_count(ids, mask, struct_ids, ok) for ids, mask, ok in rows]
    return term_sizes([mask for _, mask, _ in rows], structural)


def split_weights(
    rows: Sequence[Row],
    chunks: Sequence[Sequence[int]],  # row indices of each micro-batch, covering the mini-batch
    struct_ids: Sequence[int],
    aggregation: str,
    mini: TermSizes | None = None,
    scale: float = 1.0,
) -> list[MicroWeights]:
    """The weights of each micro-batch of one mini-batch (see the module docstring).

    Data parallel: `rows` are this rank's; `mini` gives the divisors of the GLOBAL mini-batch
    (summed over ranks) and `scale` the world size W, since FSDP averages gradients over ranks:
    W x size(micro) / size(global mini) makes that average the one-rank gradient exactly.
    """
    mini = mini or mini_sizes([rows[i] for chunk in chunks for i in chunk], struct_ids)
    out = []
    for chunk in chunks:
        w = micro_weights(mini_sizes([rows[i] for i in chunk], struct_ids), mini, aggregation)
        out.append(MicroWeights(w.policy * scale, w.kl * scale, w.anchor * scale))
    return out


def token_budget_chunks(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split item indices, in order, into micro-batches of at most `max_tokens` padded tokens.

    Padded cost of a micro-batch = its size x its longest item. An item longer than the budget
    gets a micro-batch of its own (it cannot be split without breaking the sequence).
    """
    chunks: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > max_tokens:
            chunks.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        chunks.append(current)
    return chunks


def split_even(items: list, parts: int) -> list[list]:
    """`items` in at most `parts` contiguous, near-equal, non-empty pieces (PPO mini-batches)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        stop = start + size + (p < extra)
        out.append(items[start:stop])
        start = stop
    return [o for o in out if o]
