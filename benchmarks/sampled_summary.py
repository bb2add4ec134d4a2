"""A py-spy recording (``py-spy record --format raw --idle``) as text: for each process, the wall
seconds of its main thread and of its other threads, then the main thread's functions by
inclusive and by own seconds. Sampled wall time, unlike cProfile's: a wait counts where it waits.

    python benchmarks/sampled_summary.py RECORDING.txt [--rate 100] [--rows 50]
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

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


def summary(path: Path, rate: float, rows: int) -> str:
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
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", type=Path, nargs="+")
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--rows", type=int, default=50)
    args = parser.parse_args()
    for path in args.recordings:
        print(summary(path, args.rate, args.rows))


if __name__ == "__main__":
    main()
