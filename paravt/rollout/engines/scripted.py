"""An engine that answers with scripted text: the teacher for self-traced SFT trajectories.

Driving the real agent loop with a `ScriptedEngine` yields token-exact trajectories of a chosen
behaviour (think, parallel crops of the right windows, answer) with real tool executions and real
tool-response tokens, ready for cold-start SFT. Its log-probs are 0 by definition: it is not a
policy, so its trajectories must never feed a PPO ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from paravt.rollout.engine import GenerationOutput, GenerationRequest, SamplingParams

Responder = Callable[[str], str]


class ScriptedEngine:
    """`RolloutEngine` whose continuation of a context is `responder(decoded context)`."""

    def __init__(self, tokenizer, responder: Responder, end_of_turn: str = "<|im_end|>"):
        self.tokenizer = tokenizer
        self.responder = responder
        self.end_of_turn = end_of_turn

    @property
    def weight_version(self) -> int:
        return 0

    def sync_weights(self, policy, version: int) -> None:
        raise TypeError("a ScriptedEngine has no weights to sync")

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        outputs = []
        for req in requests:
            context = self.tokenizer.decode(list(req.token_ids), skip_special_tokens=False)
            text = self.responder(context) + self.end_of_turn
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            reason = "stop" if len(ids) <= params.max_new_tokens else "length"
            ids = ids[: params.max_new_tokens]
            out = GenerationOutput(tuple(ids), (0.0,) * len(ids), reason)
            outputs.append([out] * params.n)
        return outputs
