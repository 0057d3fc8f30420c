"""The user docs hold together: every relative Markdown link of README.md and docs/ reaches a file (and a heading,
where it names one), and every claim of a kept record that the docs cite is a row of docs/claims.csv."""

from __future__ import annotations

import csv
import fnmatch
import re
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, inline code marks and punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower().replace("`", "")
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for line in text.splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            a = anchor(m.group(1))
            out.add(a if a not in seen else f"{a}-{seen[a]}")
            seen[a] = seen.get(a, 0) + 1
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links of one Markdown file that reach nothing, as 'target (why)'."""
    text = CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
            continue
        if dest.is_dir():
            dest = dest / "README.md"
        if fragment and dest.suffix == ".md" and (not dest.exists() or fragment not in anchors(dest)):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_relative_link_of_the_docs_resolves():
    broken = {str(p.relative_to(REPO)): b for p in doc_files() if (b := broken_links(p))}
    assert not broken, broken


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "b.md").write_text("# Per-σ statistics\n\n## 3. Environment\n")
    (tmp_path / "a.md").write_text("[ok](b.md#per-σ-statistics) [ok](b.md#3-environment) [gone](c.md) "
                                   "[gone](b.md#nowhere) `[code](x.md)` [web](https://example.org/x)\n")
    assert broken_links(tmp_path / "a.md") == ["c.md (no such file)", "b.md#nowhere (no such heading)"]


def test_the_claims_the_docs_cite_are_rows_of_the_ledger():
    with open(REPO / "docs/claims.csv", newline="", encoding="utf-8") as f:
        ids = [row["claim"] for row in csv.DictReader(f)]
    kept = [p.name for p in (REPO / "docs/evidence").iterdir() if (p / "record.json").exists()]
    assert kept and ids
    cited = {c for p in doc_files() for c in re.findall(r"`([^`\s]+)`", p.read_text(encoding="utf-8"))
             if any(c.startswith(k + ".") for k in kept)}
    assert cited, "the docs cite no claim of a kept record"
    unknown = sorted(c for c in cited if not any(fnmatch.fnmatchcase(i, c) for i in ids))
    assert not unknown, unknown
