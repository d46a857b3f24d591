"""Citations of benchmark sections resolve, and docs/benchmarks.md has a row for every bench script.

A citation names a file of the log and a section: docs/benchmarks/issue-26.md, "Ingress" (a heading's
start is enough: "Cascades" for "Cascades: the writer during a big cancel (issue 22, item 2)"). The
headline page (docs/benchmarks.md) cites the log the same way without the folder: issue-25.md, "...".
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "docs" / "benchmarks"
HEADLINE = ROOT / "docs" / "benchmarks.md"
CITATION = re.compile(r'(?:docs/benchmarks/)?\b((?:issue-\d+|early)\.md),?\s+\\?"([^"\\]+)')
SOURCES = ("gpulayer", "agent", "explorer", "scripts", "tests")


def _flat(text: str) -> str:
    """Whitespace and comment markers of a wrapped line folded to one space."""
    return " ".join(re.sub(r"\n\s*(?:#|--)?", " ", text).split())


def _headings(name: str) -> list[str]:
    return [_flat(m) for m in re.findall(r"^#{2,3} (.+)$", (LOG / name).read_text(), flags=re.M)]


def _citing_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in SOURCES:
        files += sorted(p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".sql") and p.is_file())
    return [p for p in files if p != Path(__file__).resolve()]


def _citations(path: Path) -> list[tuple[str, str]]:
    text = path.read_text(errors="replace")
    if path.suffix != ".md" and "benchmarks" not in text:
        return []
    return [(name, _flat(section).rstrip(" ,…")) for name, section in CITATION.findall(text)]


def test_every_cited_benchmark_section_exists():
    broken = []
    for path in _citing_files():
        for name, section in _citations(path):
            if not (LOG / name).exists():
                broken.append(f"{path.relative_to(ROOT)}: {name} (no such file)")
            elif not any(h.startswith(section) for h in _headings(name)):
                broken.append(f"{path.relative_to(ROOT)}: {name}, \"{section}\"")
    assert not broken, "benchmark citations that name no section of the log:\n" + "\n".join(broken)


def test_no_citation_names_a_section_of_the_headline_page_that_moved():
    moved = re.compile(r'docs/benchmarks\.md,?\s+\\?"')
    stale = [str(p.relative_to(ROOT)) for p in _citing_files() if moved.search(p.read_text(errors="replace"))]
    assert not stale, f"cite the log (docs/benchmarks/issue-NN.md, \"Section\") instead of docs/benchmarks.md: {stale}"


def test_every_bench_script_has_a_row_on_the_headline_page():
    text = HEADLINE.read_text()
    missing = [p.name for p in sorted((ROOT / "scripts").glob("bench_*.py")) if f"`{p.name}`" not in text]
    assert not missing, f"docs/benchmarks.md has no row for {missing}"


def test_the_log_index_lists_every_file_of_the_log():
    index = (LOG / "README.md").read_text()
    missing = [p.name for p in sorted(LOG.glob("*.md")) if p.name != "README.md" and f"]({p.name})" not in index]
    assert not missing, f"docs/benchmarks/README.md does not list {missing}"
