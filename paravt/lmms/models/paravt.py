"""`--model paravt`: lmms-eval's `lmms` API over paravt's agent protocol (`paravt.lmms.runner`).

    LMMS_EVAL_PLUGINS=paravt.lmms python -m lmms_eval --model paravt \
        --model_args pretrained=runs/demo/hf,mode=parallel --tasks TASK

Each `generate_until` request is (context, gen_kwargs, doc_to_visual, doc_id, task, split): the
context is the question as the task renders it, `doc_to_visual(doc)` its video path; the reply is
the final turn text of paravt's greedy rollout (the `<answer>` the task's own parser reads). The
generation settings are the protocol's (conf/mode), so a task's `gen_kwargs` are not applied.
Log-likelihood and multi-round requests are refused: the agent answers by generating.
"""

from __future__ import annotations

from lmms_eval.api.model import lmms

from paravt.lmms.runner import AgentRunner, Question


def _video(visuals) -> str:
    paths = [v for v in (visuals or []) if isinstance(v, str)]
    if not paths:
        raise ValueError(
            "paravt answers about one video file per question; this task's doc_to_visual gave "
            f"{type(visuals).__name__} {visuals!r:.80}"
        )
    return paths[0]


class ParaVT(lmms):
    """paravt's agent (parallel / sequential / no_tool) as an lmms-eval model."""

    def __init__(
        self,
        pretrained: str,
        mode: str = "parallel",
        frame_budget: int = 64,
        max_new_tokens: int = 2048,
        batch_size: int = 8,
        device: str = "cpu",
        **kwargs,
    ) -> None:
        super().__init__()
        if "num_frames" in kwargs:
            raise ValueError("paravt model: model_args num_frames is now frame_budget")
        if kwargs:
            raise ValueError(f"paravt model: unknown model_args {sorted(kwargs)}")
        self.runner = AgentRunner(
            pretrained, mode, int(frame_budget), int(max_new_tokens), int(batch_size), device=device
        )

    def generate_until(self, requests) -> list[str]:
        questions = []
        for req in requests:
            context, _gen_kwargs, doc_to_visual, doc_id, task, split = req.args
            doc = self.task_dict[task][split][doc_id]
            questions.append(
                Question(f"{task}/{split}/{doc_id}", context, _video(doc_to_visual(doc)))
            )
        return self.runner.answer(questions)

    def loglikelihood(self, requests):
        raise NotImplementedError("paravt answers by generating: use generate_until tasks")

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("paravt runs its own multi-turn agent: use generate_until tasks")
