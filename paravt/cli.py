"""The `paravt` console script: dispatches sub-commands to the modules that implement them.

Sub-command modules are imported lazily so `paravt --help` stays fast and a missing optional
dependency of one command does not break the others.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "make-tiny-model": (
        "paravt.models.tiny",
        "build a tiny random Qwen3-VL / Qwen2.5-VL checkpoint",
    ),
    "make-needle-data": ("paravt.video.synthetic", "write synthetic needle-in-a-video RL data"),
    "make-sft-data": (
        "paravt.data.sft_writer",
        "write scripted-teacher needle trajectories in the ParaVT SFT schema",
    ),
    "check-recipe": (
        "paravt.run.recipe",
        "check train.py overrides against devices x nodes; print a per-GPU memory plan",
    ),
    "paradox-report": (
        "paravt.run.paradox_report",
        "Tool Prior Paradox: Figure 4 and the f_tau / kappa table from run folders",
    ),
    "serve-rollout": (
        "paravt.rollout.serving.server",
        "serve rollouts from vLLM over HTTP (rollout/engine=vllm_server; needs vLLM)",
    ),
    "serve-gateway": (
        "paravt.gateway.serve",
        "serve an OpenAI-compatible gateway that trains any agent program (episodes)",
    ),
    "rollout": (
        "paravt.run.inspect",
        "run the agent on a few samples and print the trajectories",
    ),
}


def _usage() -> str:
    lines = ["usage: paravt COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<18} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"paravt: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
