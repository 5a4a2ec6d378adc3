#!/usr/bin/env python3
"""The module graph of each crate of the workspace: which module uses which, the import loops
(strongly connected components of more than one module), the floors (longest chain of uses
below a module) and the public items a crate offers.

    python3 scripts/modgraph.py            # a report for every crate
    python3 scripts/modgraph.py --check    # exit 1 if any crate has an import loop

A module is a file's top-level module (`engine.rs` and `engine/*.rs` are `engine`); a use is
any `crate::<module>` path outside `#[cfg(test)]` code (`super::` stays inside a module). Public items are
`pub fn/struct/enum/trait/type/const/static` declarations (not `pub(crate)`), methods included.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = {
    "core": ROOT / "crates/core/src",
    "runtime": ROOT / "crates/runtime/src",
    "streaming_etl": ROOT / "src",
}
ITEM = re.compile(r"^\s*pub\s+(?:unsafe\s+)?(fn|struct|enum|trait|type|const|static)\s+(\w+)", re.M)


def without_tests(text):
    """The file with its `#[cfg(test)]` items cut out (they sit at the end by convention)."""
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]


def module_of(src, path):
    rel = path.relative_to(src)
    top = rel.parts[0]
    if len(rel.parts) == 1:
        top = top[:-3]
    return top


def graph(src):
    files = sorted(src.rglob("*.rs"))
    mods = {module_of(src, f) for f in files} - {"lib", "main"}
    edges = {m: set() for m in mods}
    for f in files:
        m = module_of(src, f)
        if m not in edges:
            continue
        text = re.sub(r"//[^\n]*", "", without_tests(f.read_text()))
        for used in re.findall(r"\bcrate::(\w+)", text):
            if used in mods and used != m:
                edges[m].add(used)
        # `use crate::{a, b::c}` groups
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
            for used in re.findall(r"(?:^|,)\s*(\w+)", group):
                if used in mods and used != m:
                    edges[m].add(used)
    return edges


def sccs(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def floors(edges):
    memo = {}

    def depth(v, seen):
        if v in memo:
            return memo[v]
        if v in seen:
            return 0
        seen = seen | {v}
        d = 1 + max((depth(w, seen) for w in edges[v]), default=0)
        memo[v] = d
        return d

    return max((depth(v, frozenset()) for v in edges), default=0)


def pub_items(src):
    n = 0
    for f in src.rglob("*.rs"):
        n += len(ITEM.findall(without_tests(f.read_text())))
    return n


def main():
    check = "--check" in sys.argv
    bad = False
    for name, src in CRATES.items():
        edges = graph(src)
        loops = sccs(edges)
        bad |= bool(loops)
        print(f"{name}: {len(edges)} modules, {floors(edges)} floors, {pub_items(src)} pub items")
        for comp in loops:
            pairs = [f"{a}->{b}" for a in comp for b in sorted(edges[a]) if b in comp]
            print(f"  import loop: {{{', '.join(comp)}}}  ({', '.join(pairs)})")
        if not loops:
            print("  no import loop")
    if check and bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
