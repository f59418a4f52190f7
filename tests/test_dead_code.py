"""Every top-level function and class of the package has a user outside the tests.

Code that only tests call belongs with the tests (issue 51 found template_parity.py,
`PromptDataset`, `collate_samples`, `reduce_floats`, `causal_linear_logprobs`, `grouped_means` and
an uncalled `_has_answer_structure` in the package). A user is any mention of the name in the
package, the callbacks, the entry points, benchmarks/ and tools/, a config (`_target_`),
pyproject.toml (console scripts) or docs/reuse.md (the public names), besides its own definition.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("paravt", "callbacks")
# Found only in tests when this test was written, and not yet settled: each is named in the
# report of the change that added this test. Remove a name once it has a user or has moved.
KNOWN_TEST_ONLY = {
    "supervised_steps",  # paravt/modules/sft.py: tests' training helper
    "has_tool_call_syntax",  # paravt/agent/parsing.py
    "strip_tool_blocks",  # paravt/agent/parsing.py
    "local_numel",  # paravt/parallel/fsdp.py: the distributed tests' worker
    "make_rows",  # paravt/video/synthetic.py
}


def _sources() -> list[Path]:
    tops = (*PACKAGE, "benchmarks", "tools")
    files = [p for top in tops for p in (ROOT / top).rglob("*.py")]
    return [*files, ROOT / "train.py", ROOT / "evaluate.py"]


def _mentions() -> Counter:
    texts = [p.read_text() for p in _sources()]
    texts += [p.read_text() for p in (ROOT / "conf").rglob("*.yaml")]
    texts += [(ROOT / name).read_text() for name in ("pyproject.toml", "docs/reuse.md")]
    return Counter(word for text in texts for word in re.findall(r"\w+", text))


def _definitions() -> list[tuple[str, str]]:
    found = []
    for path in _sources():
        if path.relative_to(ROOT).parts[0] not in PACKAGE:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.append((node.name, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return found


def test_no_package_function_or_class_is_used_by_tests_only():
    mentions = _mentions()
    unused = {name: where for name, where in _definitions() if mentions[name] <= 1}
    assert set(unused) - KNOWN_TEST_ONLY == set(), (
        f"defined but never used outside tests (move to tests/ or delete): {unused}"
    )
    stale = KNOWN_TEST_ONLY - set(unused)
    assert not stale, f"now used or gone: drop from KNOWN_TEST_ONLY: {sorted(stale)}"
