"""The trajectories the stand-ins time: turn counts, crops and turn lengths, long-tailed.

A trajectory is drawn from (seed, step, prompt, rollout) alone, so every mode and topology
times the same trajectories. It takes 0..max_rounds tool rounds (`round_probs`), 1..5 crops a
round (`call_probs`), and one last turn that answers; each turn samples a lognormal number of
tokens capped at `max_new_tokens` (the tail: a few turns hit the cap). The first turn prefills
the prompt and the overview frames, each later one the crops of the round before (the context
before is in the prefix cache). Tokens are counted, never made.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .params import Params, probs


@dataclass(frozen=True)
class Turn:
    prefill: int  # new context tokens to prefill (prompt, or the last round's tool responses)
    frames: int  # frames the vision tower encodes for them
    decode: int  # tokens sampled
    crops: int  # crops this turn calls (0: it answers)


@dataclass(frozen=True)
class Rollout:
    step: int
    prompt: int  # index in the step's batch
    index: int  # 0..G-1
    turns: tuple[Turn, ...]

    @property
    def name(self) -> str:
        """As the agent loop names its requests ("<sample id>#<g>": the router's group key)."""
        return f"s{self.step}p{self.prompt}#{self.index}"

    @property
    def tokens(self) -> int:
        """The trained sequence: the whole context the update runs over."""
        return sum(t.prefill + t.decode for t in self.turns)


def _pick(rng: random.Random, weights: list[float]) -> int:
    return rng.choices(range(len(weights)), weights=weights)[0]


def draw(p: Params, step: int, prompt: int, index: int) -> Rollout:
    """Rollout `index` of prompt `prompt` of step `step`."""
    rng = random.Random(f"{p.seed}/{step}/{prompt}/{index}")
    rounds = min(_pick(rng, probs(p.round_probs)), p.max_rounds)
    calls = [1 + _pick(rng, probs(p.call_probs)) for _ in range(rounds)] + [0]
    first = p.prompt_text_tokens + round(p.overview_frames * p.tokens_per_frame)
    turns, prefill, frames = [], first, p.overview_frames
    mu = math.log(p.turn_tokens_median)
    for c in calls:
        decode = min(p.max_new_tokens, max(1, round(rng.lognormvariate(mu, p.turn_tokens_sigma))))
        turns.append(Turn(prefill, frames, decode, c))
        frames = c * p.crop_frames
        prefill = round(frames * p.tokens_per_frame) + c * p.response_text_tokens
    return Rollout(step, prompt, index, tuple(turns))


def step_rollouts(p: Params, step: int, drawer=None) -> list[list[Rollout]]:
    """The step's B groups of G rollouts (`drawer(step, prompt, index)`; default `draw`)."""
    drawer = drawer or (lambda s, b, g: draw(p, s, b, g))
    return [[drawer(step, b, g) for g in range(p.group)] for b in range(p.prompts)]
