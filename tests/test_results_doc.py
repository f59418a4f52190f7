"""The docs state each measured figure in one place, docs/results.md, and README links every page.

A *figure* of a Markdown text is a number written with a decimal point or a percent sign
(`0.781`, `21.9`, `1.47x`'s `1.47`, `24%`, `2,286.5`), read from the prose and from the fenced
blocks that show output. Not figures: the contents of inline code spans (commands, config keys,
paths: `optimizer.lr=1e-3`), fenced `bash` / `sh` blocks (commands), and version numbers (a
number with two or more decimal points, `2.14.1`, or one right after "Python", `Python 3.10`).
A sign or a trailing unit is not part of a figure: `+21.9 points` states `21.9`.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MAX_PAGES = 10
FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.S | re.M)
COMMAND_BLOCKS = {"bash", "sh", "shell", "console"}
NUMBER = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)*)(%?)")
SOFTWARE_VERSION = re.compile(r"Python\s+$")


def _prose(text: str) -> str:
    """`text` with its fenced blocks and inline code spans blanked out."""
    return re.sub(r"`[^`\n]*`", " ", FENCE.sub(" ", text))


def _output_blocks(text: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang not in COMMAND_BLOCKS]


def figures(text: str) -> set[str]:
    """The figures `text` states (module docstring)."""
    found = set()
    for part in [_prose(text), *_output_blocks(text)]:
        for match in NUMBER.finditer(part):
            number, percent = match.group(1).rstrip(","), match.group(2)
            dots = number.count(".")
            if dots > 1 or (dots == 0 and not percent):
                continue  # a version, or a plain count without a decimal point
            if SOFTWARE_VERSION.search(part[max(0, match.start() - 8) : match.start()]):
                continue
            found.add(number + percent)
    return found


def test_the_figure_definition_on_a_hand_made_text():
    text = (
        "Held-out 0.781 -> 1.000 (+21.9 points), 24% of the state, 3 min, torch 2.14.1,\n"
        "Python 3.10 or newer, `optimizer.lr=0.5` and 1,234.5 tokens.\n"
        "```bash\npython train.py reward.format_weight=0.5\n```\n"
        "```\nloss 12.315 -> 0.606 (25%)\n```\n"
    )
    assert figures(text) == {"0.781", "1.000", "21.9", "24%", "1,234.5", "12.315", "0.606", "25%"}


def test_every_figure_readme_states_is_on_the_results_page():
    readme = figures((ROOT / "README.md").read_text())
    results = figures((DOCS / "results.md").read_text())
    assert len(readme) >= 20, sorted(readme)  # the demo's table and the headline figures
    missing = sorted(readme - results)
    assert not missing, f"README states figures docs/results.md does not: {missing}"


def test_each_results_section_says_when_and_at_which_commit():
    text = (DOCS / "results.md").read_text()
    sections = re.split(r"^## ", FENCE.sub(" ", text), flags=re.M)[1:]
    assert len(sections) >= 8
    for section in sections:
        title = section.splitlines()[0]
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", section), f"{title}: no date"
        assert re.search(r"\bcommits? [0-9a-f]{7,40}\b", section), f"{title}: no commit"


def test_docs_hold_at_most_ten_pages_each_linked_from_readme():
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert 0 < len(pages) <= MAX_PAGES, pages
    assert not [p for p in DOCS.rglob("*.md") if p.parent != DOCS]  # no pages in subfolders
    links = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", (ROOT / "README.md").read_text()))
    unlinked = [p for p in pages if f"docs/{p}" not in links]
    assert not unlinked, f"docs pages README does not link: {unlinked}"
    assert all((ROOT / link).is_file() for link in links), links


def test_the_docs_cite_no_issues_sessions_or_paths_of_this_machine():
    pattern = re.compile(r"\bissue\s+\d+|\bissue's\b|\bsessions?\b|/work/|/home/|/root/", re.I)
    bad = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not bad, "\n".join(bad)
