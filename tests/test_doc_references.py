"""Every document a file cites is in the repository: a user who clones it can follow each one;
and docs/architecture.md's layout names exactly the experiments and ablations conf/ holds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC_RE = re.compile(r"[A-Za-z0-9_./-]*[A-Za-z0-9_]\.md\b")
# Markdown files paravt writes at run time (evaluation tables), named in code, not documents.
WRITTEN = {"results.md", "comparison.md"}
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", "Makefile")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split() if p.endswith(TEXT) and (ROOT / p).is_file()]


def missing_references(path: Path, text: str) -> list[str]:
    """The `.md` names in `text` that resolve to no file (from the root, the file, or docs/)."""
    bad = []
    for name in DOC_RE.findall(text):
        if name in WRITTEN:
            continue
        here = (path.parent / name, ROOT / name, ROOT / "docs" / name)
        if not any(p.is_file() for p in here):
            bad.append(name)
    return bad


def test_no_file_cites_a_document_the_repository_lacks():
    bad = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in _tracked()
        for name in missing_references(p, p.read_text(errors="replace"))
    ]
    assert not bad, "cited documents that are not in the repository:\n" + "\n".join(bad)


def test_the_check_catches_a_missing_document_and_accepts_present_ones():
    absent = [name + ".md" for name in ("PARAVT", "DESIGN")]  # spelt apart: not cited here
    text = f"see {absent[0]} section 3, {absent[1]} and docs/method.md, method.md, README.md"
    assert missing_references(ROOT / "paravt" / "x.py", text) == absent


def test_run_time_markdown_names_are_really_written_by_the_code():
    code = "\n".join(p.read_text() for p in (ROOT / "paravt").rglob("*.py"))
    for name in WRITTEN:
        assert f'"{name}"' in code, f"{name} is allowed as a run-time output but nothing writes it"


def _layout_names(group: str) -> set[str]:
    """The names docs/architecture.md's layout lists in parentheses after `group/`."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.search(rf"{group}/ \(([^)]*)\)", text, re.S).group(1)
    return {name.strip() for name in listed.replace("\n", " ").split(",")}


def test_the_architecture_layout_lists_the_experiments_and_ablations_conf_holds():
    for group in ("experiment", "ablation"):
        files = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
        listed = _layout_names(group)
        patterns = {n for n in listed if n.endswith("*")}
        covered = {f for f in files if any(f.startswith(n[:-1]) for n in patterns)}
        unknown, unlisted = listed - patterns - files, files - covered - listed
        assert not unknown, f"{group}: listed without a file: {unknown}"
        assert not unlisted, f"{group}: files not listed: {unlisted}"


# "vanilla GRPO" is the reference's vanilla recipe (experiment=demo_prior_grpo, reward shaping
# on); ablation=grpo, which turns the shaping off too, is "plain GRPO". The two names once both
# said "vanilla GRPO".
PLAIN_GRPO = re.compile(r"ablation=grpo\b|`demo_grpo`|ablation/grpo\.yaml")


def test_vanilla_grpo_names_the_reference_recipe_and_plain_grpo_the_ablation():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    mixed = [
        f"{page.relative_to(ROOT)}: {line.strip()[:120]}"
        for page in pages
        for line in page.read_text().splitlines()
        if PLAIN_GRPO.search(line) and "vanilla GRPO" in line.replace("Vanilla", "vanilla")
    ]
    assert not mixed, "ablation=grpo called vanilla GRPO:\n" + "\n".join(mixed)
    ablation = (ROOT / "conf" / "ablation" / "grpo.yaml").read_text()
    assert ablation.splitlines()[1].startswith("# Plain GRPO:")
    assert "`experiment=demo_prior_grpo`" in ablation  # the vanilla recipe, named apart
    arm = (ROOT / "conf" / "experiment" / "demo_prior_grpo.yaml").read_text()
    assert "vanilla GRPO arm (the reference's vanilla recipe; not ablation=grpo" in arm
