#!/usr/bin/env python3
"""The module map of moerl's tree and its layer check.

Prints, for every module (a folder under include/moerl/ and src/), the
modules it includes, then checks two rules that docs/architecture.md states:
  1. an include runs only downwards: a module includes modules of lower
     layers (LAYERS below), never one of its own layer or above;
  2. every header include/moerl/X/NAME.h whose implementation NAME.cpp
     exists lives in src/X/ (or a subfolder of it).
Exit status 1 names each offending include (file:line) or file.
"""
import os
import re
import sys

# Bottom to top; modules of one layer do not include each other.
LAYERS = [
    ["core"],
    ["config", "telemetry", "storage", "bench", "algo"],
    ["runtime", "hf", "moe"],
    ["comm", "text", "model"],
    ["env", "sync", "setup"],
    ["rollout"],
    ["learner"],
    ["app"],
]
LAYER_OF = {module: level for level, modules in enumerate(LAYERS) for module in modules}
INCLUDE = re.compile(r'^\s*#\s*include\s+"moerl/([a-z_]+)/')


def module_of(path, root):
    parts = os.path.relpath(path, root).split(os.sep)
    return parts[0] if len(parts) > 1 else None


def sources(root):
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith((".h", ".cpp", ".cu", ".cuh")):
                yield os.path.join(directory, name)


def main(tree):
    os.chdir(tree)
    edges, problems = {}, []
    for root in ("include/moerl", "src"):
        for path in sources(root):
            module = module_of(path, root)
            if module is None:
                continue
            if module not in LAYER_OF:
                problems.append(f"{path}: module '{module}' has no layer in scripts/structure_map.py")
                continue
            with open(path, encoding="utf-8") as text:
                for number, line in enumerate(text, 1):
                    match = INCLUDE.match(line)
                    if not match or match.group(1) == module:
                        continue
                    target = match.group(1)
                    edges.setdefault(module, set()).add(target)
                    if target not in LAYER_OF:
                        problems.append(f"{path}:{number}: includes unknown module '{target}'")
                    elif LAYER_OF[target] >= LAYER_OF[module]:
                        problems.append(f"{path}:{number}: {module} (layer {LAYER_OF[module]}) includes "
                                        f"{target} (layer {LAYER_OF[target]}): includes must run downwards")
    implementations = {}
    for path in sources("src"):
        if path.endswith(".cpp"):
            implementations.setdefault(os.path.basename(path)[:-4], []).append(os.path.dirname(path))
    for path in sources("include/moerl"):
        module, stem = module_of(path, "include/moerl"), os.path.basename(path).rsplit(".", 1)[0]
        for where in implementations.get(stem, []):
            inside = where == f"src/{module}" or where.startswith(f"src/{module}/")
            # A same-named file in a module that has its own header of that name is that header's.
            if not inside and not os.path.exists(f"include/moerl/{where.split('/')[1]}/{stem}.h"):
                problems.append(f"{path}: implemented in {where}/{stem}.cpp, outside src/{module}/")
    for level in reversed(range(len(LAYERS))):
        for module in LAYERS[level]:
            below = " ".join(sorted(edges.get(module, ()), key=lambda m: (LAYER_OF.get(m, 99), m)))
            print(f"layer {level}  {module:<10} -> {below or '-'}")
    for problem in problems:
        print("structure_map: " + problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
