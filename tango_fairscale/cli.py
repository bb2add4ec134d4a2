"""The ``tango-fairscale`` command.

::

    tango-fairscale results -w WORKSPACE [--run NAME ...] [--plot FILE.png] [--json]
    tango-fairscale eval --model PATH_OR_ID... --tasks a,b [--num_fewshot K] [--limit N] ...
    tango-fairscale run [--rendezvous-timeout SECONDS] CONFIG [tango run options]
    python -m tango_fairscale run ...          (the same; the form torchrun starts with -m)
    tango-fairscale export CHECKPOINT_DIR OUT_DIR
    tango-fairscale export --run NAME [--step N] -w WORKSPACE OUT_DIR
    tango-fairscale tiny-model OUT_DIR [--tokenizer SRC]
    tango-fairscale clean -w WORKSPACE [--run NAME ...] [--all-checkpoints] [--unfinished]
                          [--dry-run]

``results`` prints one row per run of the workspace (or of the named runs): model, tasks and
``limit``, engine, precision, devices, train steps, timings, then each task's metrics; reruns that
started no step are folded into the run whose results they reused (with a count). ``--json``
prints every run as a JSON list; ``--plot`` also draws the training loss and validation curves
into a file, one per training, labelled by the settings in which they differ.
``eval`` evaluates a model on lm-eval tasks as ``lm_eval`` does, as the cached steps of
``configs/mc_suite.jsonnet`` (:mod:`tango_fairscale.eval_cli`).
``run`` is ``tango run`` for every process of a job started by ``torchrun`` (or SLURM): rank 0
runs the Tango steps and the other ranks join its training steps
(:mod:`tango_fairscale.runtime.launcher`).
Without launcher variables it is plain ``tango run``. Its exit code is ``tango run``'s.
``export`` writes the model of a saved checkpoint (any engine, any number of processes) as a
Hugging Face directory (:mod:`tango_fairscale.export`), without starting the job: a checkpoint
directory, a work dir or a training step's result folder (``runs/NAME/trained_model``), or a run's
newest checkpoint (or step ``N``'s) by the run's name (:mod:`tango_fairscale.results.checkpoints`).
``tiny-model`` writes a small random GPT-2-shaped model for a first run, offline
(:mod:`tango_fairscale.model.tiny`).
``clean`` frees the checkpoints and weights that finished training steps no longer need, never a
running step's, a failed one's only with ``--unfinished`` (:mod:`tango_fairscale.clean`).

Problems (no workspace, no runs, an unknown run, nothing to plot, a file suffix matplotlib does
not write, not a complete checkpoint) are reported in one line on stderr with exit code 2, before
any work. A run whose records cannot be read is left out of ``results`` with one warning line
naming it. Only ``eval``, ``run``, ``export`` and ``tiny-model`` import torch (``clean`` too,
when it rewrites a checkpoint without its optimizer state).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import eval_arguments, eval_cli

PROG = "tango-fairscale"


class OneLineErrors(argparse.ArgumentParser):
    """A parser whose usage errors are one line (argparse prints the whole usage block first:
    13 lines for ``eval``), pointing to ``--help``; its subcommands' parsers are of this class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(
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
    eval_arguments.add_parser(commands)
    _add_run(commands)
    _add_export(commands)
    _add_tiny_model(commands)
    _add_clean(commands)
    return parser


def _add_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run",
        help="'tango run' on every process of a torchrun / SLURM job",
        description="Run a Tango experiment on every process of a launched job: rank 0 runs "
        "'tango run CONFIG ...'; the other ranks join its tango_fairscale::train steps.",
    )
    run.add_argument(
        "--rendezvous-timeout",
        type=_positive_seconds,
        default=600,
        metavar="SECONDS",
        help="how long the processes wait for each other to start and to answer (default 600)",
    )
    run.add_argument(
        "config", metavar="CONFIG", help="the experiment, e.g. configs/gpt2_piqa.jsonnet"
    )
    run.add_argument(
        "tango_args",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="'tango run' options: -w WORKSPACE, -D name=value, ...",
    )


def _add_export(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export",
        help="write a saved (sharded) checkpoint as a Hugging Face model directory",
        description="Consolidate a checkpoint of any engine and number of processes (FairScale "
        "rank files, an FSDP2 distributed checkpoint, ...) into a directory that "
        "AutoModelForCausalLM.from_pretrained loads, in this process alone: "
        "'export CHECKPOINT_DIR OUT_DIR' or 'export --run NAME [--step N] -w WORKSPACE OUT_DIR'.",
    )
    export.add_argument(
        "checkpoint",
        nargs="?",
        metavar="CHECKPOINT_DIR",
        help="a checkpoint (.../checkpoints/stepN), a checkpoints/ directory (its latest), a "
        "step's work directory or its result folder (WORKSPACE/runs/NAME/trained_model)",
    )
    export.add_argument("--run", metavar="NAME", help="the newest checkpoint of this run")
    export.add_argument("--step", type=int, metavar="N", help="with --run: step N's checkpoint")
    export.add_argument("-w", "--workspace", metavar="WORKSPACE", help="the run's workspace")
    export.add_argument("out_dir", metavar="OUT_DIR", help="a new (or empty) directory")


def _add_tiny_model(commands: argparse._SubParsersAction) -> None:
    tiny = commands.add_parser(
        "tiny-model",
        help="write a small random model for a first run (no hub, no GPU needed)",
        description="Write a 2-layer GPT-2-shaped model with random weights (150k parameters) "
        "and a byte-level tokenizer as a Hugging Face directory, for -D model=OUT_DIR.",
    )
    tiny.add_argument(
        "out_dir", metavar="OUT_DIR", help="a new directory (one holding a model is left as is)"
    )
    tiny.add_argument(
        "--tokenizer",
        metavar="SRC",
        help="use this tokenizer (hub id or directory) instead of the byte-level one",
    )


def _add_clean(commands: argparse._SubParsersAction) -> None:
    clean = commands.add_parser(
        "clean",
        help="free the checkpoints and weights that a workspace's finished training steps no "
        "longer need",
        description="Free the disk of a local workspace's tango_fairscale::train steps without "
        "breaking cached results: of a finished step, final_weights.pt, every checkpoint but the "
        "final one and the final one's optimizer state (what a finished run deletes itself); "
        "a running step is never touched, a failed or interrupted one only with --unfinished. "
        "Prints what it freed, step by step.",
    )
    clean.add_argument(
        "-w", "--workspace", required=True, metavar="WORKSPACE", help="workspace directory"
    )
    clean.add_argument(
        "--run",
        action="append",
        dest="runs",
        metavar="NAME",
        help="only this run's steps (repeatable; default: every step of the workspace)",
    )
    clean.add_argument(
        "--all-checkpoints",
        action="store_true",
        help="delete the final checkpoints of finished steps too (the stored result keeps the "
        "model; export --run then has no checkpoint)",
    )
    clean.add_argument(
        "--unfinished",
        action="store_true",
        help="also delete the checkpoints of failed or interrupted steps (their reruns then "
        "train from the start); a running step is never touched",
    )
    clean.add_argument(
        "--dry-run", action="store_true", help="delete nothing; print what would be freed"
    )


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0, or 2 for a problem reported on stderr)."""
    args = build_parser().parse_args(argv)
    from .results import ResultsError

    try:
        if args.command == "results":
            return _results(args)
        if args.command == "eval":
            return eval_cli.run(args, PROG)
        if args.command == "run":
            return _run(args)
        if args.command == "export":
            return _export(args)
        if args.command == "tiny-model":
            return _tiny_model(args)
        if args.command == "clean":
            from .clean import command

            return command(
                args.workspace, args.runs, args.all_checkpoints, args.unfinished, args.dry_run
            )
    except (ResultsError, CommandError, eval_cli.EvalError, OSError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled command {args.command!r}")


class CommandError(Exception):
    """A problem the command reports in one line (exit code 2)."""


def _run(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from .runtime import launcher
    from .train.launch import join_training

    timeout = timedelta(seconds=args.rendezvous_timeout)
    try:
        return launcher.run([args.config, *args.tango_args], join_training, timeout)
    except launcher.LaunchError as error:
        raise CommandError(str(error)) from None


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .results.checkpoints import run_checkpoint, work_dir_of

    if args.run is not None:
        if args.workspace is None or args.checkpoint is not None:
            raise CommandError("--run NAME takes -w WORKSPACE and OUT_DIR, not a CHECKPOINT_DIR")
        source = run_checkpoint(args.workspace, args.run, args.step)
    elif args.checkpoint is None or args.step is not None or args.workspace is not None:
        raise CommandError(
            "give CHECKPOINT_DIR OUT_DIR, or --run NAME [--step N] -w WORKSPACE OUT_DIR"
        )
    else:
        source = work_dir_of(Path(args.checkpoint))
    from .export import CheckpointError, export

    try:
        checkpoint = export(source, Path(args.out_dir))
    except CheckpointError as error:
        raise CommandError(str(error)) from None
    print(f"{PROG}: wrote the model of {checkpoint} to {args.out_dir}", file=sys.stderr)
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tango.common.exceptions import ConfigurationError

    from .model.tiny import holds_model, save_tiny_model

    if holds_model(Path(args.out_dir)):
        print(f"{PROG}: {args.out_dir} already holds a model; left as it is", file=sys.stderr)
        return 0
    try:
        save_tiny_model(Path(args.out_dir), args.tokenizer)
    except ConfigurationError as error:
        raise CommandError(str(error)) from None
    print(f"{PROG}: wrote a tiny random model to {args.out_dir}", file=sys.stderr)
    return 0


def _results(args: argparse.Namespace) -> int:
    from .results import (
        check_plot_path,
        collect_runs,
        fold_reruns,
        format_table,
        open_workspace,
        plot_curves,
    )

    if args.plot:
        check_plot_path(args.plot)
    workspace = open_workspace(args.workspace)
    unreadable: list[str] = []
    summaries = collect_runs(workspace, args.runs, unreadable)
    if not summaries:  # every run is unreadable
        more = f" (and {len(unreadable) - 1} more runs)" if len(unreadable) > 1 else ""
        raise CommandError(f"{unreadable[0]}{more}")
    for line in unreadable:
        print(f"{PROG}: warning: left out {line}", file=sys.stderr)
    if args.plot:
        names = [summary.name for summary in summaries]
        drawn = plot_curves(workspace, names, args.plot)
        skipped = [name for name in names if name not in drawn]
        note = f" (no training log: {', '.join(skipped)})" if skipped else ""
        print(f"{PROG}: wrote curves of {', '.join(drawn)} to {args.plot}{note}", file=sys.stderr)
    if args.json:
        print(json.dumps([summary.to_json() for summary in summaries], indent=2))
    else:  # a named run is shown as asked; else reruns that started no step fold into one row
        print(format_table(summaries if args.runs else fold_reruns(summaries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
