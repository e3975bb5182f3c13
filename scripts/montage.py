#!/usr/bin/env python3
"""Writes Montage-shaped workflow files for `gma broker provision` (docs/provisioning.md).

The shape follows the Pegasus Montage workflow: one mProject per input image, one mDiffFit
per pair of overlapping images (neighbours in a square grid, across and down), mConcatFit,
mBgModel, one mBackground per image (after mBgModel and its own mProject), then mImgtbl,
mAdd, mShrink and mJPEG in a chain. Runtimes, processor counts and data sizes are our
illustrative choice (not measurements), varied by up to +-20 % with a fixed seed so that the
files are reproducible; mAdd is a parallel task (8 processors) so that slot widths matter.

    python3 scripts/montage.py            # writes examples/workflows/montage-{4,25,100}.toml
    python3 scripts/montage.py 9 49       # other sizes (perfect squares)
"""

import math
import os
import random
import sys

# type: (runtime s, processors, output MB)
PROFILE = {
    "mProject": (60, 1, 8.0),
    "mDiffFit": (20, 1, 0.5),
    "mConcatFit": (120, 1, 1.0),
    "mBgModel": (300, 1, 0.1),
    "mBackground": (30, 1, 8.0),
    "mImgtbl": (30, 1, 0.5),
    "mAdd": (600, 8, 200.0),
    "mShrink": (60, 1, 20.0),
    "mJPEG": (10, 1, 2.0),
}


def workflow(images, seed=1):
    side = math.isqrt(images)
    if side * side != images or side < 1:
        raise SystemExit(f"{images}: give a perfect square (4, 9, 25, ...)")
    rng = random.Random(seed * 1000 + images)
    tasks, edges = [], []

    def task(kind, name):
        rt, procs, _ = PROFILE[kind]
        tasks.append((name, max(1, round(rt * rng.uniform(0.8, 1.2))), procs))
        return name

    def edge(a, b, kind):
        edges.append((a, b, round(PROFILE[kind][2] * rng.uniform(0.8, 1.2), 2)))

    proj = [task("mProject", f"mProject_{i}") for i in range(images)]
    pairs = []
    for r in range(side):
        for c in range(side):
            i = r * side + c
            if c + 1 < side:
                pairs.append((i, i + 1))
            if r + 1 < side:
                pairs.append((i, i + side))
    concat = "mConcatFit"
    for k, (a, b) in enumerate(pairs):
        d = task("mDiffFit", f"mDiffFit_{k}")
        edge(proj[a], d, "mProject")
        edge(proj[b], d, "mProject")
        edge(d, concat, "mDiffFit")
    task("mConcatFit", concat)
    bg = task("mBgModel", "mBgModel")
    edge(concat, bg, "mConcatFit")
    tbl = "mImgtbl"
    for i in range(images):
        b = task("mBackground", f"mBackground_{i}")
        edge(bg, b, "mBgModel")
        edge(proj[i], b, "mProject")
        edge(b, tbl, "mBackground")
    task("mImgtbl", tbl)
    add = task("mAdd", "mAdd")
    edge(tbl, add, "mImgtbl")
    shrink = task("mShrink", "mShrink")
    edge(add, shrink, "mAdd")
    jpeg = task("mJPEG", "mJPEG")
    edge(shrink, jpeg, "mShrink")
    return tasks, edges


def write(images, out_dir):
    tasks, edges = workflow(images)
    path = os.path.join(out_dir, f"montage-{images}.toml")
    with open(path, "w") as f:
        f.write(f"# Montage-shaped workflow, {images} images: written by scripts/montage.py\n")
        f.write(f"# ({len(tasks)} tasks, {len(edges)} edges; runtimes and sizes illustrative)\n")
        f.write(f'name = "montage-{images}"\n')
        for name, rt, procs in tasks:
            f.write(f'\n[[task]]\nid = "{name}"\nruntime_s = {rt}\nprocessors = {procs}\n')
        for a, b, mb in edges:
            f.write(f'\n[[edge]]\nfrom = "{a}"\nto = "{b}"\ndata_mb = {mb}\n')
    print(f"{path}: {len(tasks)} tasks, {len(edges)} edges")


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [4, 25, 100]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(root, "examples", "workflows")
    os.makedirs(out, exist_ok=True)
    for n in sizes:
        write(n, out)


if __name__ == "__main__":
    main()
