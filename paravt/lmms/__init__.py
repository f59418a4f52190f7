"""lmms-eval integration: `LMMS_EVAL_PLUGINS=paravt.lmms python -m lmms_eval --model paravt ...`
(docs/evaluation.md). `runner.AgentRunner` is the part that runs paravt's agent and needs no
lmms-eval; `models.paravt.ParaVT` is the thin `lmms` subclass lmms-eval instantiates."""
