"""Variable-length causal attention for packed rows on sdpa, with no dense mask.

A packed row holds several sequences one after another; its text positions restart at every
sequence (transformers' packing convention, `find_packed_sequence_indices`: a new sequence
starts wherever a position is not the previous one + 1). Under plain "sdpa" transformers turns
those restarts into a dense [L, L] block-diagonal mask, and sdpa then scores every query against
every key of the whole row: quadratic in the ROW, and the masked kernels skip nothing.

"paravt_varlen" (registered with transformers' `AttentionInterface` and `AttentionMaskInterface`)
does what flash-attention's varlen kernels do on GPU: each sequence attends only to itself,
causally, through `scaled_dot_product_attention(..., is_causal=True)` on its own slice: quadratic
in each SEQUENCE, with the causal kernels' skip of the masked half. The segment boundaries are
read from the positions once per forward and reused by every layer. Anything else (a padding
mask, a KV cache, a batch with no restarts) goes to transformers' own sdpa functions
unchanged, so the implementation computes what "sdpa" computes everywhere; a sliding-window
layer is refused with an error.

`varlen_attention(*models)` switches the TEXT decoder of sdpa models to it for the duration of
the context and restores it after; vision towers keep their own config. flash_attention_2/3
models are left alone (they already attend per sequence from the restarting positions) and so
are eager ones (the dense mask). Hold the context over the backward as well when the model
recomputes activations (gradient checkpointing): the recomputation dispatches by name again.
It deliberately knows nothing of trajectories, packing plans or losses (packed_forward.py).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

VARLEN = "paravt_varlen"


def segment_lengths(positions: torch.Tensor) -> list[int]:  # positions: [L] text positions
    """Lengths of the sequences of one packed row: a sequence starts at index 0 and wherever a
    position is not the previous one + 1 (e.g. [0 1 2 0 1 0] -> [3, 2, 1])."""
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    cuts = [*torch.nonzero(starts).flatten().tolist(), positions.numel()]
    return [b - a for a, b in itertools.pairwise(cuts)]


class _RowsCache:
    """The segment lengths of the last position tensor seen: every decoder layer of one forward
    (and a checkpointed layer's recomputation) gets the same `position_ids` object, so the
    boundaries are read to the host (a device sync) once per forward, not once per layer."""

    def __init__(self) -> None:
        self._ref = lambda: None  # a weak reference to the tensor the rows were read from
        self._key: tuple = ()
        self._rows: list[list[int]] = []

    def rows(self, positions: torch.Tensor, batch: int) -> list[list[int]]:
        key = (positions._version, batch, tuple(positions.shape))
        if self._ref() is not positions or self._key != key:  # another (or a changed) tensor
            self._rows = [segment_lengths(p) for p in positions.expand(batch, -1)]
            self._ref, self._key = weakref.ref(positions), key
        return self._rows


_ROWS = _RowsCache()


def varlen_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, L, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:  # ([B, L, H, D], no weights)
    """Causal attention within each sequence of each row; sdpa's own forward otherwise."""
    if kwargs.get("sliding_window") is not None:
        raise ValueError(
            f"{VARLEN} has no sliding-window attention; run this model with "
            "attn_implementation=sdpa (or flash_attention_2 on GPU) and no varlen_attention"
        )
    positions = kwargs.get("position_ids")  # [B, L] text positions
    rows = None
    if attention_mask is None and positions is not None and query.shape[2] == key.shape[2] > 1:
        rows = _ROWS.rows(positions, query.shape[0])
    if rows is None or all(len(r) == 1 for r in rows):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, **kwargs
        )
    kwargs.pop("position_ids")
    out = []  # [1, L, H, D] per row
    for b, lengths in enumerate(rows):
        pieces = zip(
            *(t[b : b + 1].split(lengths, dim=2) for t in (query, key, value)), strict=True
        )
        outs = [
            sdpa_attention_forward(module, q, k, v, None, dropout, scaling, **kwargs)[0]
            for q, k, v in pieces
        ]
        out.append(torch.cat(outs, dim=1))
    return torch.cat(out, dim=0), None


def varlen_mask(**kwargs) -> torch.Tensor | None:
    """transformers' sdpa mask, except no mask at all for a row with neither padding nor cache:
    its sequences come from the positions (`varlen_sdpa_forward`), never from an [L, L] mask."""
    no_cache = kwargs.get("q_offset", 0) == 0 and kwargs.get("kv_offset", 0) == 0
    if (
        kwargs.get("attention_mask") is None
        and no_cache
        and kwargs["q_length"] == kwargs["kv_length"]
    ):
        return None
    return sdpa_mask(**kwargs)


AttentionInterface.register(VARLEN, varlen_sdpa_forward)
AttentionMaskInterface.register(VARLEN, varlen_mask)


def text_config(model):
    """The config the text decoder's attention layers dispatch on (a VLM's `text_config`)."""
    return model.get_decoder().config


def varlen_active(model) -> bool:
    return text_config(model)._attn_implementation == VARLEN


@contextmanager
def varlen_attention(*models) -> Iterator[None]:
    """Within the context, the text decoders of the sdpa `models` attend per packed sequence
    (`VARLEN`); every switched config is restored on exit. Re-entrant; a config shared by two
    models (a LoRA policy and its adapter-free reference) is switched once."""
    switched = {}
    for model in models:
        config = text_config(model)
        if config._attn_implementation == "sdpa":
            switched[id(config)] = config
    for config in switched.values():
        config._attn_implementation = VARLEN
    try:
        yield
    finally:
        for config in switched.values():
            config._attn_implementation = "sdpa"
