"""The lmms-eval plugin registry of paravt (`LMMS_EVAL_PLUGINS=paravt.lmms`): model name ->
class name in `paravt.lmms.models.<name>`."""

AVAILABLE_MODELS = {"paravt": "ParaVT"}
