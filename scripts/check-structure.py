#!/usr/bin/env python3
"""Structure checks the compiler does not make (run by scripts/test.sh):

1. No Rust source file over 800 lines.
2. No import circle between the modules (files) of one crate: module A
   naming an item of module B (`crate::b::..`, `super::b::..`, `use super::{b, ..}`)
   is an edge A -> B; a cycle of such edges is a circle. A module's own inline
   `mod tests` belongs to it; declaring a child (`mod b;`) is not a use.

Usage: scripts/check-structure.py [--report]   (--report: also print per-crate
line counts and the module graph's size)
"""

import re
import sys
from pathlib import Path

MAX_LINES = 800
ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {"target", ".git", ".cache", "sdk"}


def crates():
    """Each crate: (name, its directory, the module roots: lib/main/bins/tests)."""
    for toml in sorted(ROOT.glob("*/Cargo.toml")):
        d = toml.parent
        if d.name in SKIP_DIRS:
            continue
        yield d


def rust_files(d):
    for p in sorted(d.rglob("*.rs")):
        if any(part in SKIP_DIRS for part in p.relative_to(ROOT).parts):
            continue
        yield p


def module_path(src: Path, f: Path):
    """The module path of file `f` under crate source dir `src` (lib.rs -> ())."""
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


PATH_RE = re.compile(r"\b(crate|super)((?:::\{?[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"use\s+(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\}", re.S)
PATH_ATTR_RE = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)')


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def crate_graph(src: Path):
    """Module files of one source tree and the edges between them."""
    files = [f for f in src.rglob("*.rs")]
    mods = {}
    # Files included with #[path] are parts of the module that includes them.
    included = {}
    for f in files:
        for rel, _name in PATH_ATTR_RE.findall(f.read_text()):
            included[(f.parent / rel).resolve()] = f
    for f in files:
        owner = f
        while owner.resolve() in included:
            owner = included[owner.resolve()]
        mods[f] = module_path(src, owner)
    known = set(mods.values())
    edges = {}
    for f, me in mods.items():
        text = strip_comments(f.read_text())
        targets = set()

        def resolve(kind, segs, base):
            if kind == "crate":
                cur = ()
            else:
                cur = base
                while segs and segs[0] == "super":
                    segs = segs[1:]
                    cur = cur[:-1]
                cur = cur[:-1] if kind == "super" else cur
            best = None
            path = cur
            if path in known:
                best = path
            for s in segs:
                path = path + (s,)
                if path in known:
                    best = path
                else:
                    break
            return best

        # In a mod.rs/lib.rs, `super` is the parent directory's module; in
        # x.rs it is x's parent too: module_path already accounts for both.
        for m in PATH_RE.finditer(text):
            segs = [s.lstrip("{") for s in m.group(2).split("::") if s]
            t = resolve(m.group(1), segs, me)
            if t is not None:
                targets.add(t)
        for m in USE_GROUP_RE.finditer(text):
            head = [s for s in m.group(2).split("::") if s]
            for item in re.split(r"[,\s]+", re.sub(r"\{[^}]*\}", "", m.group(3))):
                item = item.split("::")[0].strip()
                if item and item not in ("self", "*"):
                    t = resolve(m.group(1), head + [item], me)
                    if t is not None:
                        targets.add(t)
        targets.discard(me)
        # A use of an ancestor module (`super::Thing` defined in the parent)
        # is an edge to that ancestor; a child's items reached by its parent
        # too. Both count.
        edges.setdefault(me, set()).update(targets)
    return known, edges


def cycles(nodes, edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    report = "--report" in sys.argv
    problems = []
    total = {}
    for d in crates():
        n = 0
        for f in rust_files(d):
            lines = len(f.read_text().splitlines())
            n += lines
            if lines > MAX_LINES:
                problems.append(f"{f.relative_to(ROOT)}: {lines} lines (at most {MAX_LINES})")
        total[d.name] = n
        src = d / "src"
        if src.is_dir():
            nodes, edges = crate_graph(src)
            for c in cycles(nodes, edges):
                names = ["::".join(m) or "<root>" for m in c]
                problems.append(f"{d.name}: import circle between modules {', '.join(names)}")
    if report:
        for name, n in total.items():
            print(f"{name:16} {n:6} lines")
        print(f"{'total':16} {sum(total.values()):6} lines")
    for p in problems:
        print(f"check-structure: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print("check-structure: no file over 800 lines, no import circle", file=sys.stderr)


if __name__ == "__main__":
    main()
