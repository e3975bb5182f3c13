#!/usr/bin/env python3
"""Module import cycles inside a crate (usage: scripts/module-cycles.py CRATE/src...; DEPTH=2 for
submodules): edges A -> B when a file of module A names crate::B
(use lines or inline paths) or, from a child module, super:: of a sibling. Prints the strongly
connected components with more than one module (each is a cycle). Test code (#[cfg(test)] mod
tests blocks) is ignored, and so are a parent's uses of its own submodules (nesting, not a
cycle). Exit status 1 when a cycle is found."""
import os, re, sys

def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith('.rs'):
                continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] == 'mod':
                rel = rel[:-1]
            if rel in (['lib'], ['main']):
                rel = []
            mods['::'.join(rel)] = p
    return mods

def strip_tests(text):
    # drop `#[cfg(test)] mod x { ... }` blocks
    out = []
    i = 0
    for m in re.finditer(r'#\[cfg\(test\)\]\s*mod \w+ \{', text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth = 0
        j = m.end() - 1
        while j < len(text):
            if text[j] == '{': depth += 1
            elif text[j] == '}':
                depth -= 1
                if depth == 0: break
            j += 1
        i = j + 1
    out.append(text[i:])
    return ''.join(out)

def top(path):
    return path.split('::')[0] if path else ''

def graph(src, depth=1):
    mods = modules(src)
    names = set(mods)
    edges = {}
    for m, p in mods.items():
        text = strip_tests(open(p).read())
        text = re.sub(r'//[^\n]*', '', text)
        a = '::'.join(m.split('::')[:depth]) if m else ''
        if not a:
            continue
        targets = set()
        # crate::x::y and use crate::{x, y::z}
        for g in re.finditer(r'crate::\{', text):
            # the top-level items of a (possibly nested) use group
            nest, item, j = 1, '', g.end()
            while j < len(text) and nest > 0:
                ch = text[j]
                if ch == '{':
                    nest += 1
                elif ch == '}':
                    nest -= 1
                if nest == 1 and ch == ',' or nest == 0:
                    name = item.strip().split('::')[0].strip('{} \n')
                    if name: targets.add(name)
                    item = ''
                elif nest == 1:
                    item += ch
                j += 1
        for g in re.finditer(r'crate::(\w+)', text):
            targets.add(g.group(1))
        # super:: from a submodule (a sibling of m's parent)
        parts = m.split('::')
        for g in re.finditer(r'\bsuper::(\w+)', text):
            parent = parts[:-1]
            cand = '::'.join(parent + [g.group(1)])
            if cand in names:
                targets.add('::'.join(cand.split('::')[:depth]))
        for t in targets:
            t = '::'.join(t.split('::')[:depth])
            if t in names and t != a:
                edges.setdefault(a, set()).add(t)
    return edges

def sccs(edges):
    index, low, st, on, out = {}, {}, [], set(), []
    c = [0]
    nodes = set(edges) | {t for v in edges.values() for t in v}
    def visit(v):
        index[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index: visit(v)
    return out

if __name__ == '__main__':
    bad = 0
    for src in sys.argv[1:]:
        e = graph(src, int(os.environ.get("DEPTH", "1")))
        cs = sccs(e)
        for comp in cs:
            bad += 1
            print(f'{src}: cycle among {", ".join(comp)}')
            for a in comp:
                print(f'    {a} -> {", ".join(sorted(t for t in e.get(a, ()) if t in comp))}')
        if not cs:
            print(f'{src}: no cycle ({sum(len(v) for v in e.values())} edges among {len(e)} modules)')
    sys.exit(1 if bad else 0)
