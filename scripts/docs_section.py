"""Writes a generated section of a docs/ page: the text between the markers
`<!-- begin NAME: written by COMMAND -->` and `<!-- end NAME -->`, appended at the end of the
page the first time. What is outside the markers (the prose around the figures) is left alone."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_section(page, name, command, text):
    path = os.path.join(ROOT, page)
    with open(path) as f:
        doc = f.read()
    begin = f"<!-- begin {name}: written by {command} -->"
    end = f"<!-- end {name} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: block, doc)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)
    return path
