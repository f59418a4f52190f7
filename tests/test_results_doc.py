"""The docs state each measured figure in one place, docs/results.md, and README links every page.

Every other page (README.md, the guides of docs/, benchmarks/README.md) may quote a figure only as
results.md states it, in a block (a paragraph, list, table or fenced output, with no blank line
inside) that links the results.md section stating it (`results.md#anchor`). A block whose first
line is one of MARKERS holds numbers that are not measurements (the paper's, the code's
constants, an illustration) and is exempt, the marker naming which.

A *figure* of a Markdown text is a number written with a decimal point or a percent sign
(`0.781`, `21.9`, `1.47x`'s `1.47`, `24%`, `2,286.5`), read from the prose and from the fenced
blocks that show output. Not figures: the contents of inline code spans (commands, config keys,
paths: `optimizer.lr=1e-3`), fenced blocks that name a language (`bash` commands, `python` or
`yaml` code: only a bare or `text` fence shows output), and version numbers (a
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
OUTPUT_BLOCKS = {"", "text"}
NUMBER = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)*)(%?)")
SOFTWARE_VERSION = re.compile(r"Python\s+$")
QUOTING_PAGES = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    *sorted(p for p in DOCS.glob("*.md") if p.name != "results.md"),
]
# The kinds of numbers a guide may state without results.md: none of them is a measurement.
MARKERS = {
    "<!-- not measured: the paper's figures -->",
    "<!-- not measured: the code's constants and defaults -->",
    "<!-- not measured: software versions -->",
    "<!-- not measured: an illustration of the output's form -->",
    "<!-- not measured: a deterministic plan the command prints -->",
}
RESULTS_LINK = re.compile(r"results\.md#([\w-]+)")


def _prose(text: str) -> str:
    """`text` with its fenced blocks and inline code spans blanked out."""
    return re.sub(r"`[^`\n]*`", " ", FENCE.sub(" ", text))


def _output_blocks(text: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang in OUTPUT_BLOCKS]


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


def blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each run of non-blank lines; a fenced block stays whole."""
    found, current, start, fenced = [], [], 0, False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if line.strip() or fenced:
            start = start if current else n
            current.append(line)
        elif current:
            found.append((start, "\n".join(current) + "\n"))
            current = []
    if current:
        found.append((start, "\n".join(current) + "\n"))
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """{anchor: text} of each heading of `text`, up to the next heading of its level or above."""
    lines = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text).splitlines()
    heads = [
        (n, len(m.group(1)), m.group(2))
        for n, line in enumerate(lines)
        if (m := re.match(r"^(#+) (.*)$", line))
    ]
    raw = text.splitlines()
    found = {}
    for i, (n, level, title) in enumerate(heads):
        end = next((m for m, lv, _ in heads[i + 1 :] if lv <= level), len(raw))
        found[anchor(title)] = "\n".join(raw[n:end]) + "\n"
    return found


def unsupported_quotes(page_text: str, results_text: str) -> list[str]:
    """The blocks of a page that state figures without a results.md section stating them."""
    results = sections(results_text)
    bad = []
    for line, block in blocks(page_text):
        stated = figures(block)
        if not stated or block.splitlines()[0].strip() in MARKERS:
            continue
        linked = RESULTS_LINK.findall(block)
        unknown = [a for a in linked if a not in results]
        there = set().union(*(figures(results[a]) for a in linked if a in results))
        missing = sorted(stated - there)
        if not linked or unknown or missing:
            why = "no results.md link" if not linked else f"unknown {unknown}" if unknown else ""
            bad.append(f"line {line}: {why or f'not in the linked section: {missing}'}")
    return bad


def test_the_figure_definition_on_a_hand_made_text():
    text = (
        "Held-out 0.781 -> 1.000 (+21.9 points), 24% of the state, 3 min, torch 2.14.1,\n"
        "Python 3.10 or newer, `optimizer.lr=0.5` and 1,234.5 tokens.\n"
        "```bash\npython train.py reward.format_weight=0.5\n```\n"
        "```\nloss 12.315 -> 0.606 (25%)\n```\n"
    )
    assert figures(text) == {"0.781", "1.000", "21.9", "24%", "1,234.5", "12.315", "0.606", "25%"}


def test_a_quote_needs_a_link_to_the_section_that_states_it():
    results = "# R\n## The demo\nheld-out 0.781 -> 1.000\n## Speed\n4.37x\n"
    assert sections(results)["the-demo"] == "## The demo\nheld-out 0.781 -> 1.000\n"
    linked = "Accuracy rose to 1.000 ([results](docs/results.md#the-demo)).\n"
    assert unsupported_quotes(linked, results) == []
    # each failure: no link; a link to the wrong section; an anchor results.md lacks
    unlinked = "Accuracy rose to 1.000.\n\nCrops 4.37x faster ([r](results.md#speed)).\n"
    assert unsupported_quotes(unlinked, results) == ["line 1: no results.md link"]
    wrong = "Crops 4.37x faster ([r](results.md#the-demo)).\n"
    assert unsupported_quotes(wrong, results) == ["line 1: not in the linked section: ['4.37']"]
    assert unsupported_quotes("0.781 ([r](results.md#demo))\n", results) == [
        "line 1: unknown ['demo']"
    ]
    # a fenced output block belongs to the paragraph it follows without a blank line
    fenced = "Its output ([r](results.md#the-demo)):\n```\n\n0.781\n```\n"
    assert blocks(fenced) == [(1, fenced)] and unsupported_quotes(fenced, results) == []
    marked = "<!-- not measured: the paper's figures -->\nThe paper: 62.1.\n"
    assert unsupported_quotes(marked, results) == []


def test_every_page_quotes_figures_only_as_results_md_states_them_with_a_link():
    results = (DOCS / "results.md").read_text()
    assert len(figures((ROOT / "README.md").read_text())) >= 10  # the demo's table at least
    bad = [
        f"{page.relative_to(ROOT)} {problem}"
        for page in QUOTING_PAGES
        for problem in unsupported_quotes(page.read_text(), results)
    ]
    assert not bad, "figures quoted without their results.md section:\n" + "\n".join(bad)


def test_the_docs_stay_short():
    lengths = {p.name: len(p.read_text().splitlines()) for p in DOCS.glob("*.md")}
    assert max(lengths.values()) <= 600, lengths
    assert sum(lengths.values()) < 3500, sum(lengths.values())


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
