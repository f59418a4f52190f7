"""Token log-probs and entropy straight from hidden states and the lm_head, in bounded memory.

`token_logprobs` (logprobs.py) needs the model's full logits [N, T, V]; at T = 16k and Qwen's
V = 151,936 that tensor alone is 5 GB in bf16, and autograd keeps every fp32 chunk of it alive for
backward. Here the lm_head matmul itself is done chunk by chunk over the tokens inside one
autograd.Function: forward keeps only the per-token logsumexp (and the mean logit under p when
entropy is asked), backward recomputes each chunk's logits and turns them into the gradients of
the hidden states and the weight at once. The working set is a few [chunk, V] fp32 buffers,
whatever T is; entropy comes out of the same pass.

Distribution and alignment are those of logprobs.py: softmax(logits / temperature) with the
`suppress_ids` at -inf, gathered at `targets` (a suppressed target has log-prob -inf and gets no
gradient). `entropy[t]` is the entropy of that same distribution at position t. The gradients
equal autograd's through `token_logprobs(F.linear(hidden, weight))`
(tests/rl/test_fused_logprobs.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def _chunk_z(h: Tensor, weight: Tensor, bias: Tensor | None, temp: float, sup: Tensor) -> Tensor:
    """[C, V] fp32 logits / temperature with the suppressed ids at -inf (computed in h's dtype,
    then upcast, as the model's lm_head followed by `.float()` would)."""
    z = F.linear(h, weight, bias).float().div_(temp)
    if sup.numel():
        z.index_fill_(-1, sup, float("-inf"))
    return z


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temp, sup, chunk, with_entropy):
        # hidden [M, H], weight [V, H], bias [V] | None, targets [M] long
        m = hidden.shape[0]
        logp = hidden.new_empty(m, dtype=torch.float32)
        lse = hidden.new_empty(m, dtype=torch.float32)
        mean_z = hidden.new_zeros(m, dtype=torch.float32)  # E_p[z], for entropy and its gradient
        for s in range(0, m, chunk):
            z = _chunk_z(hidden[s : s + chunk], weight, bias, temp, sup)
            lse[s : s + chunk] = torch.logsumexp(z, dim=-1)
            logp[s : s + chunk] = z.gather(-1, targets[s : s + chunk, None]).squeeze(-1)
            if with_entropy:  # two [C, V] buffers: z and p
                p = (z - lse[s : s + chunk, None]).exp_()
                mean_z[s : s + chunk] = torch.linalg.vecdot(p, z.nan_to_num_(neginf=0.0))
        logp -= lse
        ctx.save_for_backward(hidden, weight, bias, targets, sup, lse, mean_z)
        ctx.temp, ctx.chunk, ctx.with_entropy = temp, chunk, with_entropy
        entropy = lse - mean_z if with_entropy else None
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, targets, sup, lse, mean_z = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        g_h = torch.zeros_like(hidden) if need_h else None
        g_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        )
        g_b = (
            torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
            if need_b
            else None
        )
        g_ent = g_ent if ctx.with_entropy else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            sl = slice(s, s + ctx.chunk)
            h = hidden[sl]
            z = _chunk_z(h, weight, bias, ctx.temp, sup)
            g = (z - lse[sl, None]).exp_()  # [C, V] p, turned into the gradient in place
            # d logp / dz = onehot(target) - p;  d entropy / dz = -p (z - E_p[z])
            if g_ent is not None:
                z.nan_to_num_(neginf=0.0).sub_(mean_z[sl, None]).mul_(g).mul_(g_ent[sl, None])
            g.mul_(-g_logp[sl, None] if g_logp is not None else 0.0)
            if g_logp is not None:
                g.scatter_add_(-1, targets[sl, None], g_logp[sl, None])
            if g_ent is not None:
                g -= z
            if sup.numel():
                g.index_fill_(-1, sup, 0.0)
            g = g.div_(ctx.temp)  # [C, V] gradient of the chunk's logits
            g_lo = g.to(hidden.dtype)
            if need_h:
                g_h[sl] = g_lo @ weight
            if need_w:
                g_w += (g_lo.t() @ h).float()
            if need_b:
                g_b += g.sum(0)
        g_w = g_w.to(weight.dtype) if need_w else None
        g_b = g_b.to(bias.dtype) if need_b else None
        return g_h, g_w, g_b, None, None, None, None, None


def linear_logprobs(
    hidden: Tensor,  # [N, T, H] final hidden states (after the model's last norm)
    weight: Tensor,  # [V, H] lm_head weight
    targets: Tensor,  # [N, T] long: the token whose log-prob each position gives
    temperature: float = 1.0,
    suppress_ids: Sequence[int] = (),
    chunk_size: int = 1024,
    entropy: bool = False,
    bias: Tensor | None = None,  # [V]
) -> tuple[Tensor, Tensor | None]:  # (logp [N, T] fp32, entropy [N, T] fp32 or None)
    """log softmax(hidden @ weight.T / temperature, suppressed -> -inf) at `targets`, and the
    entropy of that distribution when asked, `chunk_size` tokens at a time in both passes."""
    if hidden.dim() != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(
            f"expected hidden [N, T, H] and targets [N, T]; got {tuple(hidden.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[2]:
        raise ValueError(f"lm_head weight {tuple(weight.shape)} does not match hidden size")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (use 1.0 for greedy scoring), got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    vocab = weight.shape[0]
    bad = [i for i in suppress_ids if not 0 <= int(i) < vocab]
    if bad:
        raise ValueError(f"suppress_ids {bad} are outside the vocabulary [0, {vocab})")
    n, t, h = hidden.shape
    sup = torch.as_tensor(sorted({int(i) for i in suppress_ids}), dtype=torch.long)
    flat_t = targets.reshape(-1).long().to(hidden.device)
    logp, ent = _LinearLogprobs.apply(
        hidden.reshape(n * t, h),
        weight,
        bias,
        flat_t,
        float(temperature),
        sup.to(hidden.device),
        int(chunk_size),
        bool(entropy),
    )
    return logp.view(n, t), (ent.view(n, t) if ent is not None else None)
