"""The README fits on a screen and its links lead somewhere (issue 37): at most 150 lines, no table row a screen wide,
every relative link of README.md and docs/index.md naming a file (and a heading, where it names one) that exists, and
docs/layout.md naming every module of workflow/amprepro/, so the layout cannot fall behind the code again."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
INDEX = REPO / "docs" / "index.md"
LAYOUT = REPO / "docs" / "layout.md"
PACKAGE = REPO / "workflow" / "amprepro"

README_MAX_LINES = 150
TABLE_ROW_MAX_CHARS = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(markdown: Path) -> list[str]:
    """Every link target that is not a URL, outside code blocks."""
    text = re.sub(r"```.*?```", "", markdown.read_text(encoding="utf-8"), flags=re.S)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", markdown.read_text(encoding="utf-8"), flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def broken_links(markdown: Path) -> list[str]:
    broken = []
    for target in relative_links(markdown):
        path, _, anchor = target.partition("#")
        resolved = (markdown.parent / path).resolve() if path else markdown
        if not resolved.exists():
            broken.append(f"{target}: no such file {shown(resolved)}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {shown(resolved)}")
    return broken


def test_the_readme_is_at_most_150_lines_with_no_table_row_a_screen_wide():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move the detail into a guide under docs/ "
        f"(docs/index.md lists them) and leave one line and a link in the README's Routes")
    wide = [n for n, line in enumerate(lines, 1) if line.startswith("|") and len(line) > TABLE_ROW_MAX_CHARS]
    assert not wide, f"README.md table rows over {TABLE_ROW_MAX_CHARS} characters at lines {wide}"


def test_every_relative_link_of_the_readme_and_the_docs_index_resolves():
    for markdown in (README, INDEX):
        assert relative_links(markdown), f"{markdown.name}: no relative link found (is the pattern still right?)"
        assert broken_links(markdown) == [], f"{markdown.relative_to(REPO)} has broken links"


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "there.md").write_text("# Title\n\n## Several GPUs on one machine\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#several-gpus-on-one-machine) [gone](gone.md) [no heading](there.md#nowhere)\n"
                    "[url](https://example.org/x.md)\n```\n[in code](also-gone.md)\n```\n")
    assert [b.split(":")[0] for b in broken_links(page)] == ["gone.md", "there.md#nowhere"]


def test_the_layout_names_every_module_of_the_package():
    layout = LAYOUT.read_text(encoding="utf-8")
    modules = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert len(modules) > 40
    missing = [m for m in modules if f"`{m}`" not in layout]
    assert missing == [], f"docs/layout.md has no line for {missing}: add one each, from the module's docstring"
    named = set(re.findall(r"`([a-z0-9_/]+\.py)`", layout.split("## The package", 1)[1]))
    gone = sorted(named - set(modules))
    assert gone == [], f"docs/layout.md lists modules that no longer exist: {gone}"
