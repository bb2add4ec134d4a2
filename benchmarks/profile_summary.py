"""The processes profiled under ``profile_hook/sitecustomize.py`` as text: for each ``.prof`` file
in a folder, its total seconds and the functions that took them (cumulative and own time)."""

from __future__ import annotations

import argparse
import io
import pstats
from pathlib import Path


def summary(path: Path, rows: int) -> str:
    """One process's profile: the ``rows`` functions of most cumulative and of most own time."""
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    out.write(f"### {path.name}: {stats.total_tt:.2f} s profiled\n")  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(rows)
    stats.sort_stats("tottime").print_stats(rows)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rows", type=int, default=40)
    args = parser.parse_args()
    for path in sorted(args.folder.glob("*.prof"), key=lambda p: p.stat().st_mtime):
        print(summary(path, args.rows))


if __name__ == "__main__":
    main()
