"""README is a front door and docs/ holds one page per topic (issue 42): every link between them lands.

- every relative markdown link in README.md and docs/*.md names a file that exists, and its `#anchor` a
  heading of that file, spelled as GitHub spells heading anchors;
- every heading of the README before issue 42 has a home: the page and heading it moved to exist;
- README stays under 250 lines; each command's --help names the docs page that explains it; what
  `make demo` and `make real-demo` print about README names a README heading.

The command lines of these pages are checked in tests/test_help_examples.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lpes.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#* *$")

# The README's sections before issue 42 (main e06891f) -> (page, heading) that now holds each.
OLD_README_HEADINGS = {
    "lpes": ("README.md", "lpes"),
    "Two commands": ("README.md", "Two commands"),
    "The pipeline": ("README.md", "The pipeline"),
    "CLI": ("README.md", "CLI"),
    "The spec file (`best.json`)": ("docs/search.md", "The spec file (`best.json`)"),
    "Python API": ("docs/architecture.md", "The Python API"),
    "How the reference works (`converter/lpes_rope.py`)":
        ("docs/architecture.md", "How the reference works (`converter/lpes_rope.py`)"),
    "Search (`lpes-search`)": ("docs/search.md", "Searching a curve: `lpes-search`"),
    "ONNX export (`--to onnx`)": ("docs/targets.md", "ONNX export (`--to onnx`)"),
    "Validation (`lpes-validate`, also run by `lpes-convert`)":
        ("docs/validation.md", "Validation: `lpes-validate`, data, verdicts and exit codes"),
    "Data (`--data`, the same for `lpes-search`, `lpes-convert` and `lpes-validate`)":
        ("docs/validation.md", "Data (`--data`, the same for `lpes-search`, `lpes-convert` and `lpes-validate`)"),
    "TensorRT engines (`--to tensorrt`, experimental: never built here)":
        ("docs/targets.md", "TensorRT engines (`--to tensorrt`, experimental: never built here)"),
    "onnxruntime-genai (`--to genai`)": ("docs/targets.md", "onnxruntime-genai (`--to genai`)"),
    "Real pretrained models (`smollm2-135m`, `gemma3-270m`, `make real-demo`)":
        ("docs/real-models.md", "Real pretrained models: `smollm2-135m`, `gemma3-270m`, and a model you bring"),
    "The premise, decided on a real model (SmolLM2-135M, 200 held-out prompts)":
        ("docs/results.md", "The premise, decided on a real model (SmolLM2-135M, 200 held-out prompts)"),
    "The premise on Gemma 3 270M (200 held-out prompts at 20 pairs, 374 tokens, and at 50, 884 tokens)":
        ("docs/results.md",
         "The premise on Gemma 3 270M (200 held-out prompts at 20 pairs, 374 tokens, and at 50, 884 tokens)"),
    "The bundled models and what LPES does to them":
        ("docs/results.md", "The bundled models and what LPES does to them"),
    "`lpes-tiny-induction`: per-layer beats uniform scaling; YaRN and dynamic NTK beat both (`make demo`)":
        ("docs/results.md",
         "`lpes-tiny-induction`: per-layer beats uniform scaling; YaRN and dynamic NTK beat both (`make demo`)"),
    "`lpes-tiny-kv`: retrieval only, where one scale suffices":
        ("docs/results.md", "`lpes-tiny-kv`: retrieval only, where one scale suffices"),
    "Compatibility (`make compat`)": ("docs/compat.md", "The transformers matrix (`make compat`)"),
    "lm-evaluation-harness (`make lm-eval`)": ("docs/compat.md", "lm-evaluation-harness (`make lm-eval`)"),
    "Development": ("README.md", "Development"),
}

# The page each command's --help points to.
HELP_PAGES = {"lpes-search": "docs/search.md", "lpes-convert": "docs/targets.md",
              "lpes-validate": "docs/validation.md", "lpes-generate": "docs/targets.md"}


def prose(text: str) -> list[str]:
    """The lines of a markdown text outside fenced and indented code blocks (links and headings live there)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("    "):
            lines.append(re.sub(r"`[^`]*`", "``", line) if not HEADING.match(line) else line)
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    return [m.group(2) for line in prose(text) if (m := HEADING.match(line))]


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets GitHub's -1, -2 suffixes."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(text):
        base = anchor(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    """`page: target (why)` for every relative link of `page` to a missing file or heading."""
    broken = []
    for line in prose(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto: are not this repository's to check
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif fragment and (linked.suffix != ".md" or fragment not in anchors(linked.read_text())):
                broken.append(f"{page.name}: {target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_names_a_page_and_heading_that_exist(page):
    assert broken_links(page) == []


def test_the_link_check_catches_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A heading (`--flag`, with punctuation)\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Here\n\n"
                    "[ok](other.md#a-heading---flag-with-punctuation) [ok](#here) [web](https://example.com/x)\n"
                    "[gone](missing.md) [no heading](other.md#nowhere) [no local heading](#there)\n"
                    "    [in code](missing-too.md)\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)", "page.md: other.md#nowhere (no such heading)",
                                  "page.md: #there (no such heading)"]


@pytest.mark.parametrize(("heading", "expected"), [
    ("Data (`--data`, the same for `lpes-search`, `lpes-convert` and `lpes-validate`)",
     "data---data-the-same-for-lpes-search-lpes-convert-and-lpes-validate"),
    ("The premise, decided on a real model (SmolLM2-135M, 200 held-out prompts)",
     "the-premise-decided-on-a-real-model-smollm2-135m-200-held-out-prompts"),
    ("`make real-demo`", "make-real-demo"),
])
def test_anchors_are_spelled_as_github_spells_them(heading, expected):
    """Expected values as GitHub renders these headings' links (lowercase, punctuation dropped, spaces to -)."""
    assert anchor(heading) == expected


def test_a_repeated_heading_gets_a_numbered_anchor():
    assert anchors("# A\n## Notes\n## Notes\n```\n# not a heading\n```\n") == {"a", "notes", "notes-1"}


def test_every_old_readme_section_has_a_home():
    missing = [f"{old} -> {page}: {new}" for old, (page, new) in OLD_README_HEADINGS.items()
               if new not in headings((ROOT / page).read_text())]
    assert missing == []


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines"
    linked = {target.split("#")[0] for line in prose(README.read_text()) for target in LINK.findall(line)}
    pages = {f"docs/{page.name}" for page in PAGES[1:]}
    assert pages <= linked, f"README links no {sorted(pages - linked)}"


def test_each_new_page_opens_with_what_it_answers():
    for page in PAGES[1:]:
        if page.name in ("method.md", "architecture.md", "tiny-model-notes.md"):  # pages older than issue 42
            continue
        first = next(line for line in page.read_text().splitlines()[1:] if line.strip())
        assert first.startswith("This page answers:"), f"{page.name} opens with {first!r}"


@pytest.mark.parametrize(("prog", "page"), HELP_PAGES.items())
def test_each_help_points_to_the_page_that_explains_it(prog, page):
    text = build_parser(prog).format_help()
    assert page in text, f"{prog} --help does not name {page}"
    named = set(re.findall(r"docs/[\w.-]+\.md", text))
    assert all((ROOT / name).is_file() for name in named), named
    assert prog in (ROOT / page).read_text()


def test_what_make_demo_prints_about_readme_names_a_readme_section():
    """The demos' closing words send the user to README sections by name; each must still be there."""
    echoed = [line for line in (ROOT / "Makefile").read_text().splitlines() if line.strip().startswith("@echo")]
    cited = [m.group(1) for line in echoed for m in re.finditer(r"README, \\?[\"']([^\"'\\]+)", line)]
    assert cited, "the demos' closing words cite no README section: this test checks nothing"
    readme = headings(README.read_text())
    assert [c for c in cited if not any(h.startswith(c) for h in readme)] == []
