"""The documentation: every relative link of README.md and docs/*.md leads to a file that exists
and, with a #anchor, to a heading of it (GitHub's anchor rules); README.md stays short.

Needs neither the extension nor DuckDB (`make pytest` runs it with the rest). conftest.py imports
duckdb, so where that is missing: `pytest --noconftest test/python/test_docs.py`, or without pytest
`python3 test/python/test_docs.py`.
"""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README_MAX_BYTES = 15 * 1024

LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]*)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def doc_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def anchor(heading):
    """GitHub's anchor of a heading: markup dropped, lowercase, punctuation except '-' and '_'
    dropped, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """The anchors of a file's headings (a repeated one also as name-1, name-2, ...)."""
    seen = {}
    out = set()
    with open(path, encoding="utf-8") as f:
        for _, line in prose_lines(f.read()):
            m = HEADING.match(line)
            if not m:
                continue
            a = anchor(m.group(2))
            if a in seen:
                seen[a] += 1
                out.add(f"{a}-{seen[a]}")
            else:
                seen[a] = 0
                out.add(a)
    return out


def links(path):
    """(line number, target) of every link in a file's prose (code spans and blocks excluded)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for n, line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "", line)
        for m in LINK.finditer(line):
            yield n, m.group(1)


def broken_links():
    broken = []
    for path in doc_files():
        name = os.path.relpath(path, ROOT)
        for n, target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
                continue
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                broken.append(f"{name}:{n}: {target}: no file {os.path.relpath(dest, ROOT)}")
            elif frag and (not dest.endswith(".md") or frag not in anchors(dest)):
                broken.append(f"{name}:{n}: {target}: no heading #{frag} in {os.path.relpath(dest, ROOT)}")
    return broken


def test_relative_links_resolve():
    broken = broken_links()
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_links_are_found():
    # The checks above would pass vacuously if no link were recognised.
    targets = [t for p in doc_files() for _, t in links(p)]
    assert "docs/semantics.md#sources" in targets
    assert "../README.md" in targets


def test_anchor_rules():
    assert anchor("Tables (created when missing)") == "tables-created-when-missing"
    assert anchor("DuckDB's checkpoints during a run") == "duckdbs-checkpoints-during-a-run"
    assert anchor("`streaming_etl_run(topic, window_ms, lateness_ms, ...)`") == "streaming_etl_runtopic-window_ms-lateness_ms-"
    assert anchor("Security: DuckDB's sandbox holds") == "security-duckdbs-sandbox-holds"


def test_readme_is_short():
    size = os.path.getsize(os.path.join(ROOT, "README.md"))
    assert size <= README_MAX_BYTES, f"README.md has {size} bytes, at most {README_MAX_BYTES}: move detail to docs/"


if __name__ == "__main__":
    for test in (test_relative_links_resolve, test_links_are_found, test_anchor_rules, test_readme_is_short):
        test()
    print("ok")
