"""Every relative link of README.md, HACKING.md, CHANGELOG.md and docs/ (design/ included) reaches a file
of the tree, and every #anchor a heading of the page it names (GitHub's way of making anchors of headings).

The pages move: the measurement history of docs/ went to docs/design/, and a link left behind would say
"How we got here" and lead nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    """The Markdown pages whose links are checked (those of this tree that exist)."""
    found = [ROOT / name for name in ("README.md", "HACKING.md", "CHANGELOG.md") if (ROOT / name).is_file()]
    return found + sorted((ROOT / "docs").rglob("*.md"))


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(page: Path) -> list[str]:
    """The links of `page` (outside code blocks) that reach no file, or no heading of the page named."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, frag = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            bad.append(f"{target}: no such file")
        elif frag and where.suffix == ".md":
            if frag not in {anchor(h) for h in re.findall(r"^#+ (.*)$", where.read_text(), re.M)}:
                bad.append(f"{target}: no such heading")
    return bad


def test_every_doc_link_reaches_its_target() -> None:
    if not (ROOT / "HACKING.md").is_file():
        pytest.skip(f"the source tree is not beside the tests at {ROOT} (a staged copy of tests/, README and docs/ "
                    "alone: the links reach files it does not hold)")
    broken = {str(p.relative_to(ROOT)): bad for p in pages() if (bad := broken_links(p))}
    assert not broken, f"links that lead nowhere: {broken}"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading, here\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading-here) [gone](design/gone.md) [bad](there.md#nowhere)\n"
                    "```sh\n[in code](not/checked.md)\n```\n")
    assert broken_links(page) == ["design/gone.md: no such file", "there.md#nowhere: no such heading"]
