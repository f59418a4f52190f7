"""The sampled token's log-prob, one decoding step at a time, for transformers' `generate`.

A `LogitsProcessor` placed after generate's own processors: each step it scales the logits by
the temperature, sets the suppressed ids to -inf (the distribution the engine samples from, as
`paravt.rl.logprobs.token_logprobs` defines it), keeps that step's log-softmax [N, V] and returns
the scaled logits for generate to sample from (so generate itself must be given temperature 1).
At the next step the token just sampled is the last of `input_ids`: its log-prob is gathered and
the previous [N, V] is dropped. Memory: one step's [N, V] fp32 plus [N, T] log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SampledLogprobs:
    """Callable as a transformers `LogitsProcessor` (input_ids [N, L], scores [N, V])."""

    def __init__(self, temperature: float, suppress_ids: Sequence[int] = ()):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.suppress_ids = [int(i) for i in suppress_ids]
        self._last: torch.Tensor | None = None  # [N, V] log-softmax of the previous step
        self._taken: list[torch.Tensor] = []  # [N] per generated token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._last is not None:
            self._taken.append(self._last.gather(-1, input_ids[:, -1:]).squeeze(-1))
        z = scores.float() / self.temperature
        if self.suppress_ids:
            ids = torch.tensor(self.suppress_ids, dtype=torch.long, device=z.device)
            z = z.index_fill(-1, ids, float("-inf"))
        self._last = z - torch.logsumexp(z, dim=-1, keepdim=True)
        return z

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:  # [N, T_new] -> [N, T_new]
        """The log-probs of the generated tokens (call once, after generate returns)."""
        if self._last is not None:
            self._taken.append(self._last.gather(-1, new_tokens[:, -1:]).squeeze(-1))
            self._last = None
        if len(self._taken) != new_tokens.shape[1]:
            raise RuntimeError(
                f"recorded {len(self._taken)} decoding steps for {new_tokens.shape[1]} generated "
                "tokens: was this processor shared between generate calls?"
            )
        if not self._taken:
            return torch.zeros(new_tokens.shape, dtype=torch.float32)
        return torch.stack(self._taken, dim=1)
