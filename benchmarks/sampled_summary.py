"""py-spy recordings (``py-spy record --format raw --idle``) as text: for each process, the wall
seconds of its main thread and of its other threads, then the main thread's functions by
inclusive and by own seconds, and its call tree down to ``--tree-s``. Sampled wall time, unlike
cProfile's: a wait counts where it waits.

    python benchmarks/sampled_summary.py RECORDING.txt... [--rate 100] [--rows 40] [--tree-s 0.3]
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path
from typing import Any

# Frames of a raw py-spy line: 'process 12:"cmd";process 15:"child";func (file.py:12);... 7'
# (a command line can hold ';', not '";').
_PROCESS = re.compile(r'process \d+:".*?";')
_THREAD_ROOT = "Thread._bootstrap"


def short(frame: str) -> str:
    """``func (path/to/site-packages/pkg/mod.py:12)`` as ``func pkg/mod.py`` (no line number)."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/main/", "/tmp/site/", "/root/"):
        path = path.split(marker)[-1]
    return f"{name} {path}".strip()


def call_tree(
    stacks: list[tuple[list[str], int]], rate: float, floor_s: float, max_depth: int = 18
) -> list[str]:
    """The stacks as an indented call tree: each call's inclusive seconds, those of at least
    ``floor_s``, ``max_depth`` deep; a chain of single calls (Tango's and click's layers) shown
    once; the import machinery's own frames left out."""
    Node = dict[str, Any]
    root: Node = {"samples": 0, "children": {}}
    for frames, count in stacks:
        node = root
        node["samples"] += count
        for frame in frames:
            if "<frozen importlib" in frame:  # an import shows as the modules it runs
                continue
            node = node["children"].setdefault(short(frame), {"samples": 0, "children": {}})
            node["samples"] += count
    lines: list[str] = []

    def show(name: str, node: Node, depth: int) -> None:
        last = name
        # A node whose one shown child holds all of its time: shown as "first ⇢ last" of the chain.
        while True:
            kept = [(n, c) for n, c in node["children"].items() if c["samples"] / rate >= floor_s]
            if len(kept) != 1 or kept[0][1]["samples"] != node["samples"]:
                break
            last, node = kept[0]
        shown = name if last == name else f"{name} ⇢ {last}"
        lines.append(f"{node['samples'] / rate:8.2f}  {'  ' * depth}{shown}")
        if depth < max_depth:
            for child_name, child in sorted(kept, key=lambda item: -item[1]["samples"]):
                show(child_name, child, depth + 1)

    show("(main thread)", root, 0)
    return lines


def summary(path: Path, rate: float, rows: int, floor_s: float) -> str:
    """The recording at ``path`` (sampled ``rate`` times a second) as text."""
    main_threads: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    other_s: collections.Counter[str] = collections.Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        process = "(one process)"
        while found := _PROCESS.match(stack):  # a child's frames follow its parents'
            process, stack = found.group()[:-1][:160], stack[found.end() :]
        frames = stack.split(";")
        if any(frame.startswith(_THREAD_ROOT) for frame in frames[:3]):
            other_s[process] += int(samples)
        else:
            main_threads[process].append((frames, int(samples)))
    out = [f"## {path.name} (py-spy, {rate:g} samples/s, idle included)\n"]
    for process, stacks in main_threads.items():
        total = sum(count for _, count in stacks)
        out.append(
            f"### {process}\nmain thread {total / rate:.2f} s; other threads "
            f"{other_s[process] / rate:.2f} s (summed over threads)\n"
        )
        inclusive: collections.Counter[str] = collections.Counter()
        own: collections.Counter[str] = collections.Counter()
        for frames, count in stacks:
            names = [short(frame) for frame in frames]
            for name in set(names):
                inclusive[name] += count
            if names:
                own[names[-1]] += count
        for title, counter in (("inclusive", inclusive), ("own", own)):
            out.append(f"{title} seconds (main thread):")
            out += [f"{count / rate:8.2f}  {name}" for name, count in counter.most_common(rows)]
            out.append("")
        out.append(f"call tree (main thread, calls of at least {floor_s:g} s):")
        out += call_tree(stacks, rate, floor_s) + [""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", type=Path, nargs="+")
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--tree-s", type=float, default=0.3)
    args = parser.parse_args()
    for path in args.recordings:
        print(summary(path, args.rate, args.rows, args.tree_s))


if __name__ == "__main__":
    main()
