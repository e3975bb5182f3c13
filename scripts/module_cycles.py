#!/usr/bin/env python3
"""Import cycles among the modules of one crate (one file per module under src/).

An edge A -> B when A's code (tests excluded: from `#[cfg(test)]` on) names `crate::B` (also
inside `use crate::{B, ...}`), or, in lib.rs/main.rs, names `B::` for a module B it declares;
an item of the crate root used from a module is an edge to `lib`. Prints every strongly
connected component of more than one module and exits 1 if there is one.

    scripts/module_cycles.py gma/src bench/src
"""
import os
import re
import sys


def strip(text):
    """Drops comments, string and char literals, and the test module (one left-to-right pass)."""
    cut = text.find("#[cfg(test)]")
    if cut >= 0:
        text = text[:cut]
    token = re.compile(
        r'//[^\n]*|/\*(?:.|\n)*?\*/'  # comments
        r'|\bb?r(#*)"(?:.|\n)*?"\1'  # raw strings
        r'|b?"(?:\\[\s\S]|[^"\\])*"'  # strings
        r"|b?'(?:\\.|[^'\\])'"  # char literals (a lifetime has no closing quote)
    )
    return token.sub(lambda m: '""' if m.group(0)[-1] in "\"'" else " ", text)


def graph(src):
    files = {f[:-3]: os.path.join(src, f) for f in os.listdir(src) if f.endswith(".rs")}
    root = "lib" if "lib" in files else "main"
    root_text = strip(open(files[root]).read())
    mods = set(re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", root_text, re.M))
    root_items = set(re.findall(r"\b(?:fn|struct|enum|const|static|type|trait)\s+(\w+)", root_text))
    edges = {m: set() for m in mods | {root}}
    for name in edges:
        text = strip(open(files[name]).read())
        names = re.findall(r"\bcrate::(\w+)", text)
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
            names += re.findall(r"(\w+)", group)
        if name == root:
            names += [m for m in re.findall(r"\b(\w+)::", text) if m in mods]
        for n in names:
            if n in mods and n != name:
                edges[name].add(n)
            elif n in root_items and name != root:
                edges[name].add(root)
    return edges


def sccs(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def main():
    bad = False
    for src in sys.argv[1:] or ["gma/src"]:
        edges = graph(src)
        cycles = sccs(edges)
        n = sum(len(e) for e in edges.values())
        if cycles:
            bad = True
            for c in cycles:
                print(f"{src}: cycle among {len(c)} modules: {', '.join(c)}")
        else:
            print(f"{src}: {len(edges)} modules, {n} edges, no cycle")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
