"""``tango-fairscale eval``: lm-evaluation-harness's command line over ``configs/mc_suite.jsonnet``.

::

    tango-fairscale eval --model PATH_OR_ID --tasks piqa,arc_easy [--num_fewshot K] [--limit N]
        [--precision P] [--batch_size B] [--device_count N] [--engine E]
        [--task_data_dir DIR] [-w WORKSPACE] [--output_path PATH]

is ``tango run configs/mc_suite.jsonnet -D model=... -D tasks=... -D num_fewshot=K -D limit=N
-D train_steps=0`` (with tango.yml's defaults for the rest), run in this process as ``tango run``
runs it: the same steps with the same cache keys, so a rerun, or a ``tango run`` of the same
settings in the same workspace, starts no step. ``--batch_size`` is the scoring steps' batch size
(not part of their cache key). Afterwards it prints lm-eval's results table
(``lm_eval.utils.make_table``) and, with ``--output_path``, writes lm-eval's results JSON where
``lm_eval --output_path`` (lm-eval 0.4.13's ``EvaluationTracker``) writes it: for a path ending in
``.json``, ``<stem>_<date>.json`` beside it; for any other path (a directory),
``<path>/<model name with / and : as __>/results_<date>.json``.

Arguments that cannot be right are refused in one line before any work, with the command line
checks of ``tango run`` (:mod:`tango_fairscale.command_line`: inputs that cannot be found) and the
config's own (a task listed twice); an unknown task is refused with the closest names when Tango
builds the steps, before any step runs.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from datetime import datetime
from pathlib import Path

from .eval_results import header, lm_eval_results, results_file, results_tables, write_results
from .evaluation import DEFAULT_BATCH_SIZE

#: The config and settings the command runs: the repository's (next to the package).
REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG = REPO_ROOT / "configs" / "mc_suite.jsonnet"
SETTINGS = REPO_ROOT / "tango.yml"

ENGINES = ("ddp", "fairscale", "fsdp2", "pipe")
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true")


class EvalError(Exception):
    """A problem the command reports in one line (exit code 2)."""


def default_workspace() -> Path:
    """``$XDG_CACHE_HOME/tango-fairscale/workspace`` (``~/.cache/...`` without it)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tango-fairscale" / "workspace"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``eval`` subcommand's parser, under ``commands``."""
    parser = commands.add_parser(
        "eval",
        help="evaluate a model on lm-eval tasks like lm_eval, as cached Tango steps",
        description="Evaluate a model on lm-eval tasks with the package's scorer: "
        "'tango run configs/mc_suite.jsonnet' with these settings (the same cached steps), "
        "then lm-eval's results table, and its results JSON with --output_path.",
    )
    _add_settings(parser)
    parser.add_argument(
        "-w",
        "--workspace",
        metavar="WORKSPACE",
        help=f"Tango workspace holding the cached steps (default {_home(default_workspace())}; "
        "'tango-fairscale results -w WORKSPACE' lists its runs)",
    )
    parser.add_argument(
        "--output_path",
        metavar="PATH",
        help="write lm-eval's results JSON as lm_eval does: PATH.json -> PATH_<date>.json; a "
        "directory -> PATH/<model>/results_<date>.json",
    )


def _add_settings(parser: argparse.ArgumentParser) -> None:
    """The options that become the config's variables (and ``--batch_size``'s override)."""
    parser.add_argument(
        "--model", required=True, metavar="PATH_OR_ID", help="model directory or hub id"
    )
    parser.add_argument(
        "--tasks",
        required=True,
        type=_task_list,
        metavar="TASK[,TASK...]",
        help="lm-eval task, group or tag names, comma-separated",
    )
    parser.add_argument(
        "--num_fewshot",
        type=_count,
        default=0,
        metavar="K",
        help="few-shot examples per context (default 0)",
    )
    parser.add_argument(
        "--limit",
        type=_count,
        default=0,
        metavar="N",
        help="at most N documents per task (default 0: all)",
    )
    parser.add_argument(
        "--precision", choices=PRECISIONS, help="scoring precision (default: tango.yml's, auto)"
    )
    parser.add_argument(
        "--batch_size",
        type=_positive,
        metavar="B",
        help=f"queries per scoring batch (default {DEFAULT_BATCH_SIZE}; speed only: not cached)",
    )
    parser.add_argument(
        "--device_count",
        type=_positive,
        metavar="N",
        help="the config's device_count: devices for training; evaluation scores on one device "
        "(the GPU when there is one)",
    )
    parser.add_argument(
        "--engine", choices=ENGINES, help="the config's engine (used when it trains)"
    )
    parser.add_argument(
        "--task_data_dir",
        metavar="DIR",
        help="local task data: DIR/<task>/<split>.jsonl (default: the tasks' hub datasets)",
    )


def run(args: argparse.Namespace, prog: str) -> int:
    """Run the command (``prog``: the program, for its messages); returns its exit code
    (``tango run``'s when that fails). Raises :class:`EvalError` for a problem to report."""
    if not CONFIG.is_file() or not SETTINGS.is_file():
        raise EvalError(
            f"{CONFIG} not found: 'eval' runs the repository's configs/mc_suite.jsonnet; install "
            "the package from its source tree (pip install -e .)"
        )
    for value in (args.model, args.task_data_dir):
        if value is not None and "=" in value:
            raise EvalError(f"'=' in {value!r}: Tango's -D values cannot hold one")
    if args.output_path:  # made now: a path that cannot hold the results fails before any work
        try:
            results_file(args.output_path, args.model, "DATE").parent.mkdir(
                parents=True, exist_ok=True
            )
        except OSError as error:
            raise EvalError(f"--output_path {args.output_path}: {error}") from None
    workspace = args.workspace or str(default_workspace())
    if "://" not in workspace:
        workspace = str(Path(workspace).expanduser().resolve())
    name = f"eval-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    argv = tango_arguments(args, workspace, name)
    started = time.time()
    code = _tango(argv)
    if code != 0:
        return code
    results = lm_eval_results(workspace, name, args, started)
    print(header(args))
    print(results_tables(results))
    if args.output_path:
        path = write_results(results, args.output_path)
        print(f"{prog}: wrote {path}", file=sys.stderr)
    return 0


def tango_arguments(args: argparse.Namespace, workspace: str, name: str) -> list[str]:
    """The ``tango`` command line (without the program) that evaluates ``args``."""
    defines = {
        "model": args.model,
        "tasks": ",".join(args.tasks),
        "num_fewshot": str(args.num_fewshot),
        "limit": str(args.limit),
        "train_steps": "0",
    }
    for field in ("precision", "device_count", "engine", "task_data_dir"):
        value = getattr(args, field)
        if value is not None:
            defines[field] = str(value)
    argv = ["--settings", str(SETTINGS), "run", str(CONFIG), "-w", workspace, "-n", name]
    for key, value in defines.items():
        argv += ["-D", f"{key}={value}"]
    if args.batch_size is not None:  # Tango's overrides: a dotted path per field
        dotted = [task for task in args.tasks if "." in task]
        if dotted:
            raise EvalError(
                f"--batch_size cannot be set for a task with a dot in its name: {dotted[0]!r}"
            )
        overrides = {f"steps.scores_{task}.batch_size": args.batch_size for task in args.tasks}
        argv += ["-o", json.dumps(overrides)]
    return argv


def _tango(argv: list[str]) -> int:
    """``tango ARGV`` in this process, after what it would refuse before any step is refused
    here in one line (:func:`check`)."""
    from tango.__main__ import main as tango_main

    from .runtime.collector import collect_less

    check(argv)
    collect_less()  # as in ``tango run``'s own process
    try:
        tango_main(args=argv, prog_name="tango")
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def check(argv: list[str]) -> None:
    """Raise :class:`EvalError` with what ``tango ARGV`` (a ``run`` with ``--settings``) would
    refuse before any step, in one line: the config's own checks (a task listed twice), those of
    building its steps (an unknown task, with the closest names), then ``tango run``'s command
    line checks (:mod:`~tango_fairscale.command_line`: every missing input in one message, a
    workspace that is not writable)."""
    from tango.common import Params
    from tango.common.util import import_module_and_submodules
    from tango.settings import TangoGlobalSettings
    from tango.step_graph import StepGraph

    from . import compat  # noqa: F401  (Tango's fixes, before it runs)
    from .command_line import check_workspace_writable, parse_tango_run
    from .compat.tango_errors import brief_message
    from .inputs import check_inputs

    run = parse_tango_run(argv)
    assert run is not None and run.settings is not None
    # The variables as Tango reads them: tango.yml's defaults, then the -D values.
    defaults = TangoGlobalSettings.from_file(run.settings).environment or {}
    defines = dict(item.split("=", 1) for item in run.ext_vars)
    try:
        params = Params.from_file(run.experiment, run.overrides or "", {**defaults, **defines})
        steps = params.pop("steps")
        import_module_and_submodules("tango_fairscale")  # tango.yml's include_package
        StepGraph.from_params(steps.duplicate())  # loads no model (see evaluation.shared_model)
        check_inputs(steps.as_dict(quiet=True))
        check_workspace_writable(run.workspace)
    except Exception as error:  # noqa: BLE001  (an unexpected one is raised again)
        brief = brief_message(error)
        if brief is None:
            raise
        raise EvalError(brief) from None


def _task_list(text: str) -> list[str]:
    tasks = [name.strip() for name in text.split(",") if name.strip()]
    if not tasks:
        raise argparse.ArgumentTypeError(f"names no task: {text!r}")
    return tasks


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value


def _home(path: Path) -> str:
    home = os.path.expanduser("~")
    text = str(path)
    return "~" + text[len(home) :] if text.startswith(home + os.sep) else text
