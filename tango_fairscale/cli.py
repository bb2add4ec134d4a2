"""The ``tango-fairscale`` command.

::

    tango-fairscale results -w WORKSPACE [--run NAME ...] [--plot FILE.png] [--json]

``results`` prints one row per run of the workspace (or of the named runs): model, engine,
precision, devices, train steps and the PIQA validation metrics; ``--json`` prints the same as a
JSON list; ``--plot`` also draws the training loss and validation accuracy curves into a file.
Problems (no workspace, no runs, an unknown run, nothing to plot) are reported in one line on
stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

PROG = "tango-fairscale"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Tools for tango_fairscale runs in a Tango workspace."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    results = commands.add_parser(
        "results",
        help="tabulate the runs of a workspace and plot their training curves",
        description="Tabulate runs of configs/gpt2_piqa.jsonnet: configuration, status, metrics.",
    )
    results.add_argument(
        "-w",
        "--workspace",
        required=True,
        metavar="WORKSPACE",
        help="workspace directory or URL, e.g. ./workspace or local:///tmp/workspace",
    )
    results.add_argument(
        "--run",
        action="append",
        dest="runs",
        metavar="NAME",
        help="only this run (repeatable; default: every run, oldest first)",
    )
    results.add_argument(
        "--plot",
        metavar="FILE",
        help="write training loss and validation accuracy curves here",
    )
    results.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0, or 2 for a problem reported on stderr)."""
    args = build_parser().parse_args(argv)
    from .results import ResultsError

    try:
        if args.command == "results":
            return _results(args)
    except (ResultsError, OSError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled command {args.command!r}")


def _results(args: argparse.Namespace) -> int:
    from .results import collect_runs, format_table, open_workspace, plot_curves

    workspace = open_workspace(args.workspace)
    summaries = collect_runs(workspace, args.runs)
    if args.plot:
        names = [summary.name for summary in summaries]
        drawn = plot_curves(workspace, names, args.plot)
        skipped = [name for name in names if name not in drawn]
        note = f" (no training log: {', '.join(skipped)})" if skipped else ""
        print(f"{PROG}: wrote curves of {', '.join(drawn)} to {args.plot}{note}", file=sys.stderr)
    if args.json:
        print(json.dumps([summary.to_json() for summary in summaries], indent=2))
    else:
        print(format_table(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
