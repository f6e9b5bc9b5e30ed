#!/usr/bin/env python3
"""Checks the include graph against the layers of ARCHITECTURE.md.

A code folder may include only from folders of lower layers; folders on one layer meet only
through messages/. Exits 1 and lists every offending include.
"""
import pathlib
import re
import sys

LAYERS = {
    "messages": 0,
    "config": 1,
    "search": 1,
    "tpu_nodes": 2,
    "agents": 2,
    "cluster": 2,
    "actors": 3,
    "cli": 4,
}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def violations(root: pathlib.Path):
    for folder, layer in LAYERS.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".hpp", ".cpp", ".h", ".cc"):
                continue
            for target in INCLUDE.findall(path.read_text(errors="replace")):
                top = target.split("/", 1)[0]
                if top == "maxkernel":  # generated Cap'n Proto headers belong to messages/
                    top = "messages"
                if top not in LAYERS or top == folder:
                    continue
                if LAYERS[top] >= layer:
                    yield f"{path.relative_to(root)}: includes {target} ({top} is layer " \
                          f"{LAYERS[top]}, {folder} is layer {layer})"


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    found = list(violations(root))
    for v in found:
        print(v)
    print(f"{len(found)} layer violations")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
