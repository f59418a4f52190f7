"""Every GPU-only branch has a test that takes its GPU side on CPU (issue 50), or says why not.

A branch is a call of `torch.cuda.is_available()`, `gpu_placement()` or `has_cuda()`, or a
comparison of a device type with "cuda" / "cpu", in paravt/, callbacks/, train.py and
evaluate.py. docs/development.md ("GPU-only branches and the tests that force them") lists
each by file and function with its forcing test; this test fails on a branch missing there, on
a row whose branch is gone, and on a named test that does not exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALLS = {"is_available", "gpu_placement", "has_cuda"}
HEADING = "### GPU-only branches and the tests that force them"


def _is_branch(node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "is_available":
            return ast.unparse(func) == "torch.cuda.is_available"
        return name in CALLS
    if isinstance(node, ast.Compare):
        left = node.left
        typed = (isinstance(left, ast.Attribute) and left.attr == "type") or (
            isinstance(left, ast.Name) and left.id == "device_type"
        )
        return typed and any(
            isinstance(c, ast.Constant) and c.value in ("cuda", "cpu") for c in node.comparators
        )
    return False


def gpu_branches() -> set[tuple[str, str]]:
    """(file, innermost function) of every branch."""
    files = [*ROOT.glob("paravt/**/*.py"), *ROOT.glob("callbacks/**/*.py")]
    files += [ROOT / "train.py", ROOT / "evaluate.py"]
    found = set()
    for path in files:
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            inner = {id(n) for f in ast.walk(func) if f is not func for n in _defs_body(f)}
            if any(_is_branch(n) and id(n) not in inner for n in ast.walk(func)):
                found.add((str(path.relative_to(ROOT)), func.name))
    return found


def _defs_body(node: ast.AST) -> list[ast.AST]:
    """Nodes inside a nested function (they belong to it, not to the enclosing one)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return list(ast.walk(node))
    return []


def documented() -> dict[tuple[str, str], str]:
    text = (ROOT / "docs" / "development.md").read_text()
    table = text.split(HEADING, 1)[1]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| (.+) \|$", table, flags=re.M)
    return {(f, fn): how for f, fn, how in rows}


def test_every_gpu_branch_is_listed_with_its_forcing_test():
    found, listed = gpu_branches(), documented()
    assert ("paravt/rollout/engines/vllm.py", "placement_kwargs") in found  # the walk sees them
    assert not found - set(listed), f"add to docs/development.md: {sorted(found - set(listed))}"
    assert not set(listed) - found, f"no such branch any more: {sorted(set(listed) - found)}"


def test_every_named_forcing_test_exists():
    for (path, func), how in documented().items():
        named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", how)
        assert named or how.startswith("the CUDA call itself"), (path, func, how)
        for file, test in named:
            source = (ROOT / file).read_text()
            assert re.search(rf"^def {test}\(", source, flags=re.M), f"{file}::{test}"
