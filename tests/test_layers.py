"""The house's layering, enforced: the pure core imports no framework (docs/architecture.md),
and the packages import only downward, with no circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = [
    "paravt.types",
    "paravt.video.sampling",
    "paravt.agent.parsing",
    "paravt.agent.prompts",
    "paravt.agent.scripts",
    "paravt.agent.tools",
    "paravt.rewards.compose",
    "paravt.rewards.structural",
    "paravt.rewards.judge",
    "paravt.rl.advantages",
    "paravt.rl.losses",
    "paravt.rl.kl",
    "paravt.rl.logprobs",
    "paravt.rl.budget",
    "paravt.rl.metrics",
    "paravt.rl.objective",
    "paravt.rl.algorithm",
    "paravt.rl.paragrpo_loss",
    "paravt.data.schemas",
    "paravt.data.sft_schema",
    "paravt.rl.microbatch",
    "paravt.progress",
    "paravt.parallel.distributed",
    "paravt.rollout.records",
    "paravt.rollout.engine",
    "paravt.rollout.sync.stream_buffer",
    "paravt.eval.scoring",
    "paravt.eval.lmms_scoring",
    "paravt.eval.adapters",
]
# lmms_eval: paravt reimplements its scoring (paravt.eval.lmms_scoring), never imports it
FORBIDDEN = ("lightning", "hydra", "vllm", "decord", "pytorch_lightning", "lmms_eval")


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_framework(module):
    code = (
        f"import sys, {module}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


# ---- the import graph: no circle, no upward import --------------------------------------------
# Lowest first. A module may import from its own layer's package or from a lower layer, never
# from a higher one. Function-level (lazy) imports count: a lazy import is still a dependency.
LAYERS: list[tuple[str, ...]] = [
    ("paravt", "paravt.types", "paravt.errors", "paravt.progress"),  # foundation
    ("paravt.video",),  # frames: sampling, decoding, synthetic videos
    ("paravt.rewards",),  # pure reward functions
    ("paravt.rl",),  # pure objective: advantages, losses, budgets, micro-batches
    ("paravt.models",),  # torch models: loading, Qwen-VL inputs, forward passes
    ("paravt.parallel",),  # ranks, collectives, FSDP2
    ("paravt.rollout",),  # engine contract and engines
    ("paravt.agent",),  # the agent protocol on an engine
    ("paravt.gateway",),  # the OpenAI-compatible gateway: agent programs on an engine
    ("paravt.data",),  # datasets, SFT encoding, PromptDataModule
    ("paravt.eval",),  # benchmark adapters, scoring, runner
    ("paravt.generator",),  # the asynchronous rollout generator process and its messages
    ("paravt.modules",),  # Lightning objects
    ("paravt.callbacks",),  # Lightning callbacks (the top-level callbacks/ folder)
    # run assembly, cold start, reports, `paravt rollout`; the override hints train.py,
    # evaluate.py and check-recipe print (config_hints imports nothing of paravt)
    ("paravt.run", "paravt.config_hints"),
    ("paravt.cli", "paravt.sweep", "paravt.lmms"),  # entry points, plugins
]
ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    out = {}
    for top in ("paravt", "callbacks"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = ("paravt", *parts) if top == "callbacks" else parts  # pyproject's mapping
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports (a `from pkg import sub` names the submodule)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    return {m for m in found if m in known}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(path, name, known) - {name} for name, path in known.items()}


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank is not None, f"{module} is in no layer: add its package to LAYERS"
    return rank


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_no_import_goes_up_a_layer():
    bad = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
        for a, targets in _graph().items()
        for b in targets
        if _layer(b) > _layer(a)
    ]
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle():
    found = _cycle(_graph())
    assert found is None, "import circle: " + " -> ".join(found)


def test_the_checks_see_an_upward_import_and_a_circle():
    graph = {"paravt.rl.a": {"paravt.run.b"}, "paravt.run.b": {"paravt.rl.a"}}
    assert _layer("paravt.run.b") > _layer("paravt.rl.a")
    assert _cycle(graph) == ["paravt.rl.a", "paravt.run.b", "paravt.rl.a"]
    real = _graph()
    assert "paravt.rollout.engine" in real["paravt.rollout.engines.vllm"]  # edges are really read
    assert "paravt.models.qwen_vl" in real["paravt.models.forward"]


def test_every_package_says_its_role_in_its_init_docstring():
    for top in ("paravt", "callbacks"):
        for init in (ROOT / top).rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc and doc.splitlines()[0].strip(), f"{init.relative_to(ROOT)}: no docstring"
    folders = {p.parent for p in (ROOT / "paravt").rglob("*.py")}
    assert all((f / "__init__.py").exists() for f in folders), "a paravt folder is no package"
