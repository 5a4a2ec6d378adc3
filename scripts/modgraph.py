#!/usr/bin/env python3
"""The module graphs of the project: for each crate of the workspace, which module uses which,
and for the Python folders (`scripts/`, `test/python/`), which file imports which; with the
import loops (strongly connected components of more than one node), the floors (longest chain
of uses, counting the node itself) and, for crates, the public items they offer.

    python3 scripts/modgraph.py            # a report for every graph
    python3 scripts/modgraph.py --edges    # the same, with every node's uses
    python3 scripts/modgraph.py --check    # exit 1 if any graph has an import loop

Rust: every file of the crate is a node, named by its module path (`format`, `format::avro`,
`crate` for `lib.rs`); a file is the crate's when its parent declares it (`mod x;`) outside
`#[cfg(test)]` code. A use is any path outside `#[cfg(test)]`
items and comments: `crate::a::b::c` counts for the longest prefix that is a file's module
(`a::b` when `a/b.rs` exists and `a/b/c.rs` does not), `super::x` and `self::x` are resolved
from the file's module (or the inline `mod` they sit in), a path may also start at a child
module (`avro::AvroSchema` in `format/mod.rs`), and `{a, b::c}` groups count for each of their
paths. Declaring a child (`mod child;`) is not a use of it; re-exporting from it (`pub use
child::X`) is. A file's uses of its own items are not edges. Public items are
`pub fn/struct/enum/trait/type/const/static` declarations (not `pub(crate)`), methods included.

Python: every `.py` file of a folder is a node; an edge is an `import x` or `from x import ...`
statement (at any indentation) that resolves to another file of the same folder, searching
the folders the file puts on `sys.path` (`sys.path.insert(0, ...)`, the last insert first)
before its own, as Python does for the script that runs.
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
PY_FOLDERS = {
    "scripts": ROOT / "scripts",
    "test/python": ROOT / "test/python",
}
ITEM = re.compile(r"^\s*pub\s+(?:unsafe\s+)?(fn|struct|enum|trait|type|const|static)\s+(\w+)", re.M)
CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


# --- Rust -------------------------------------------------------------------------------------

def code_only(text):
    """`text` with comments removed and string and char literals emptied (same positions of the
    rest do not matter; braces inside literals no longer count)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c in "rb" and re.match(r"(?:br|r)#*\"", text[i:i + 40]) and not re.match(r"\w", text[i - 1:i] or " "):
            m = re.match(r"(?:br|r)(#*)\"", text[i:])
            end = text.find('"' + m.group(1), i + m.end())
            out.append('""')
            i = n if end < 0 else end + 1 + len(m.group(1))
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'":
            m = re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\])'", text[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def item_end(code, i):
    """The end of the item that starts at `i`: its `;`, or the `}` closing its first block."""
    depth = 0
    while i < len(code):
        c = code[i]
        if c == ";" and depth == 0:
            return i + 1
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(code)


def without_tests(code):
    """The code with every `#[cfg(test)]` item cut out."""
    while True:
        m = CFG_TEST.search(code)
        if not m:
            return code
        code = code[:m.start()] + code[item_end(code, m.end()):]


def file_module(src, path):
    """A file's module path: () for the crate root, ("format", "avro") for format/avro.rs."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts.pop()
    return tuple(parts)


def crate_files(src):
    """The crate's files by module path: those the crate root declares, through `mod x;` in
    their parent outside `#[cfg(test)]` (a test-only file, or one nothing declares, is not one)."""
    files = {file_module(src, f): f for f in src.rglob("*.rs")}
    out = {(): files[()]} if () in files else {}
    todo = list(out)
    while todo:
        parent = todo.pop()
        code = without_tests(code_only(out[parent].read_text()))
        for name in re.findall(r"\bmod\s+(\w+)\s*;", code):
            child = parent + (name,)
            if child in files:
                out[child] = files[child]
                todo.append(child)
    return out


def inline_modules(code):
    """(start, end, name) of each inline `mod name { ... }` block."""
    spans = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
        spans.append((m.end() - 1, item_end(code, m.end() - 1), m.group(1)))
    return spans


def parse_tree(code, i):
    """The paths of the use tree (or plain path) that starts at `i` (just after a `::`), and
    where it ends. Each path is a list of segments; `*` and `self` segments are dropped."""
    ws = re.compile(r"\s*")
    i = ws.match(code, i).end()
    if i < len(code) and code[i] == "{":
        paths, i = [], i + 1
        while True:
            i = ws.match(code, i).end()
            if i >= len(code) or code[i] == "}":
                return paths, i + 1
            if code[i] == ",":
                i += 1
                continue
            sub, i = parse_tree(code, i)
            paths += sub
    m = re.compile(r"\w+|\*").match(code, i)
    if not m:
        return [[]], i
    seg, i = m.group(), m.end()
    j = ws.match(code, i).end()
    if code.startswith("::", j):
        sub, i = parse_tree(code, j + 2)
        return [([seg] if seg not in ("self", "*") else []) + p for p in sub], i
    rest = [] if seg in ("self", "*") else [seg]
    m = re.compile(r"\s+as\s+\w+").match(code, i)
    return [rest], (m.end() if m else i)


def uses_of(code, here, modules):
    """The modules the code of the file of module `here` uses (module paths)."""
    spans = inline_modules(code)
    children = {}
    for m in modules - {()}:
        children.setdefault(m[:-1], set()).add(m[-1])
    start = re.compile(r"(?<![\w:])(\$?crate|super|self|\w+)\s*::")
    used = set()
    i = 0
    while True:
        m = start.search(code, i)
        if not m:
            return used
        scope = here + tuple(name for s, e, name in spans if s < m.start() < e)
        head = m.group(1).lstrip("$")
        if head == "crate":
            base = ()
        elif head in ("self", "super"):
            base = scope
            j = m.start()
            # super::super::...
            while True:
                k = re.compile(r"(self|super)\s*::\s*").match(code, j)
                if not k:
                    break
                base = base[:-1] if k.group(1) == "super" else base
                j = k.end()
            trees, i = parse_tree(code, j)
            for p in trees:
                used.add(longest_module(base + tuple(p), modules))
            continue
        elif head in children.get(scope, ()):
            base = scope + (head,)
        else:
            i = m.end()
            continue
        trees, i = parse_tree(code, m.end())
        for p in trees:
            used.add(longest_module(base + tuple(p), modules))


def longest_module(path, modules):
    while path not in modules:
        path = path[:-1]
    return path


def name(mod):
    return "::".join(mod) or "crate"


def rust_graph(src):
    by_mod = crate_files(src)
    modules = set(by_mod)
    edges = {}
    for mod, f in by_mod.items():
        code = without_tests(code_only(f.read_text()))
        edges[name(mod)] = {name(u) for u in uses_of(code, mod, modules) if u != mod}
    return edges


def pub_items(src):
    n = 0
    for f in crate_files(src).values():
        n += len(ITEM.findall(without_tests(code_only(f.read_text()))))
    return n


# --- Python -----------------------------------------------------------------------------------

def search_path(text, folder):
    """The folders a script searches for imports: those it inserts into sys.path (the last
    insert first), then its own."""
    found = []
    for arg in re.findall(r"sys\.path\.insert\(\s*0\s*,\s*(.+)\)\s*$", text, re.M):
        if arg.strip() == "HERE":
            found.insert(0, folder)
        elif "ROOT" in arg:
            found.insert(0, ROOT.joinpath(*re.findall(r"\"([^\"]+)\"", arg)))
    return found + [folder]


def py_graph(folder):
    files = sorted(folder.glob("*.py"))
    edges = {}
    for f in files:
        text = f.read_text()
        path = search_path(text, folder)
        names = set(re.findall(r"^\s*from\s+(\w+)\s+import\b", text, re.M))
        for group in re.findall(r"^\s*import\s+([\w ,]+?)\s*(?:#.*)?$", text, re.M):
            names |= {n.split()[0].split(".")[0] for n in group.split(",") if n.strip()}
        used = set()
        for n in names:
            hit = next((d / f"{n}.py" for d in path if (d / f"{n}.py").exists() and d / f"{n}.py" != f), None)
            if hit is not None and hit.parent == folder:
                used.add(hit.stem)
        edges[f.stem] = used
    return edges


# --- graphs -----------------------------------------------------------------------------------

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


def report(title, edges, what, extra, show_edges):
    loops = sccs(edges)
    print(f"{title}: {len(edges)} {what}, {floors(edges)} floors{extra}")
    for comp in loops:
        pairs = [f"{a}->{b}" for a in comp for b in sorted(edges[a]) if b in comp]
        print(f"  import loop: {{{', '.join(comp)}}}  ({', '.join(pairs)})")
    if not loops:
        print("  no import loop")
    if show_edges:
        for v in sorted(edges):
            print(f"    {v} -> {', '.join(sorted(edges[v])) or '-'}")
    return bool(loops)


def main():
    check = "--check" in sys.argv
    show = "--edges" in sys.argv
    bad = False
    for title, src in CRATES.items():
        bad |= report(title, rust_graph(src), "modules", f", {pub_items(src)} pub items", show)
    for title, folder in PY_FOLDERS.items():
        bad |= report(title, py_graph(folder), "files", "", show)
    if check and bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
