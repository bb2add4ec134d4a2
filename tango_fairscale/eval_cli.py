"""``tango-fairscale eval``: lm-evaluation-harness's command line over ``configs/mc_suite.jsonnet``.

::

    tango-fairscale eval --model PATH_OR_ID... --tasks piqa,arc_easy [--num_fewshot K] [--limit N]
        [--seed S] [--include_path DIR] [--gen_kwargs KEY=VALUE...]
        [--precision P] [--batch_size B] [--device DEVICE] [--device_count N] [--engine E]
        [--task_data_dir DIR] [-w WORKSPACE] [--output_path PATH [--log_samples]]

is ``tango run configs/mc_suite.jsonnet -D model=... -D tasks=... -D num_fewshot=K -D limit=N
-D train_steps=0`` (``-D num_fewshot=`` without ``--num_fewshot``: each task's own, as lm_eval;
``--seed``'s few-shot seed as ``-D fewshot_seed``; ``--task_data_dir DIR`` whose ``DIR/piqa``
holds PIQA's official release files also as ``-D data_dir=DIR/piqa``, their reader;
tango.yml's defaults for the rest), run in this process as ``tango run``
runs it: the same steps with the same cache keys, so a rerun, or a ``tango run`` of the same
settings in the same workspace, starts no step. ``--batch_size`` is the scoring steps' batch size
(not part of their cache key). Afterwards it prints lm-eval's results table
(``lm_eval.utils.make_table``) and, with ``--output_path``, writes lm-eval's results JSON where
``lm_eval --output_path`` (lm-eval 0.4.13's ``EvaluationTracker``) writes it: for a path ending in
``.json``, ``<stem>_<date>.json`` beside it; for any other path (a directory),
``<path>/<model name with / and : as __>/results_<date>.json``; with ``--log_samples``, each
task's per-document samples beside it, as ``lm_eval --log_samples`` writes them (lm-eval's own
``EvaluationTracker``), from the scores steps and each task's documents, loaded again (the steps
keep none) for ``doc`` and lm-eval's hashes.

Several models (``--model CKPT1 CKPT2 ...``: the checkpoints of a run) are evaluated in turn in
this one process, each as its own Tango run (``<run name>-<i>``) with its own table and files:
the libraries are imported once, the requests are built by the first and read from the cache by
the others (chat-templated prompts excepted: each tokenizer writes its own), and each model is
released before the next one loads. Every model's arguments and inputs are checked before any
model's work (a tokenizer without a chat template under ``--apply_chat_template`` included); the
first model that fails stops the command, which names the models left unevaluated.

An ``lm_eval`` command line for the Hugging Face backend runs with its program name changed:
``--model hf --model_args pretrained=PATH_OR_ID[,dtype=D]`` names the model (``dtype``: float32 is
``--precision 32-true``, bfloat16 ``bf16-true``, auto the package's ``auto``), ``--batch_size
auto`` (or ``auto:N``) is the package's default batches, ``--device cuda``, ``cuda:N`` or ``cpu``
picks where scoring runs (through ``CUDA_VISIBLE_DEVICES``, set before CUDA starts), and
``--apply_chat_template``, ``--fewshot_as_multiturn`` and ``--system_instruction`` format the
prompts as lm_eval does (the config's variables of the same names).

Arguments that cannot be right are refused in one line before any work, with the command line
checks of ``tango run`` (:mod:`tango_fairscale.command_line`: inputs that cannot be found) and the
config's own (a task listed twice); an unknown task is refused with the closest names when Tango
builds the steps, before any step runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
import time
from datetime import datetime
from pathlib import Path

from .eval_arguments import default_workspace
from .eval_options import EvalError, check_chat, take_gen_kwargs, take_model_args, use_device
from .eval_results import (
    header,
    lm_eval_results,
    new_date_id,
    results_file,
    results_tables,
    write_results,
    write_samples,
)

#: The config and settings the command runs: the repository's (next to the package).
REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG = REPO_ROOT / "configs" / "mc_suite.jsonnet"
SETTINGS = REPO_ROOT / "tango.yml"


def run(args: argparse.Namespace, prog: str) -> int:
    """Run the command (``prog``: the program, for its messages); returns its exit code
    (``tango run``'s when that fails). Raises :class:`EvalError` for a problem to report."""
    if not CONFIG.is_file() or not SETTINGS.is_file():
        raise EvalError(
            f"{CONFIG} not found: 'eval' runs the repository's configs/mc_suite.jsonnet; install "
            "the package from its source tree (pip install -e .)"
        )
    take_model_args(args)
    take_gen_kwargs(args)
    check_chat(args)
    if args.device is not None:
        use_device(args.device)
    workspace = args.workspace or str(default_workspace())
    if "://" not in workspace:
        workspace = str(Path(workspace).expanduser().resolve())
    if args.log_samples and not args.output_path:
        raise EvalError("--log_samples needs --output_path: the samples are written beside it")
    if args.output_path:
        refuse_one_file_for_several(args.output_path, args.models)
    name = f"eval-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    names = [name] if len(args.models) == 1 else [f"{name}-{i}" for i in range(len(args.models))]
    evaluations = [
        (one, run_name, tango_arguments(one, workspace, run_name))
        for one, run_name in zip(per_model(args), names)
    ]
    for _, _, argv in evaluations:  # every model's refusals before any model's work
        check(argv)
    if args.apply_chat_template:
        for model in args.models:
            check_chat_template(model)
    if args.output_path:
        make_output_folders(args.output_path, args.models)
    for index, (one, run_name, argv) in enumerate(evaluations):
        code = evaluate(one, workspace, run_name, argv, prog)
        if code != 0:
            if len(evaluations) > 1:
                left = " ".join(args.models[index + 1 :]) or "none"
                print(
                    f"{prog}: model {index + 1} of {len(evaluations)} ({one.model}) failed; "
                    f"not evaluated: {left}",
                    file=sys.stderr,
                )
            return code
    return 0


def evaluate(
    args: argparse.Namespace, workspace: str, name: str, argv: list[str], prog: str
) -> int:
    """Run the Tango run ``name`` (``tango ARGV``) for ``args.model``, then print its results as
    lm_eval does and write its files; returns the run's exit code."""
    started = time.time()
    code = _tango(argv)
    if code != 0:
        return code
    results = lm_eval_results(workspace, name, args, started)
    print(header(args))
    print(results_tables(results))
    if args.output_path:
        written_at = new_date_id()
        path = write_results(results, args.output_path, written_at)
        print(f"{prog}: wrote {path}", file=sys.stderr)
        if args.log_samples:
            count = write_samples(
                workspace, name, args.tasks, args.output_path, args.model, written_at
            )
            print(f"{prog}: wrote {count} samples files beside it", file=sys.stderr)
    release_models()
    return 0


def refuse_one_file_for_several(output_path: str, models: list[str]) -> None:
    """Refuse (:class:`EvalError`) an ``--output_path`` file for several models' results."""
    if len(models) > 1 and Path(output_path).suffix == ".json":
        raise EvalError(
            f"--output_path {output_path} is one file, and {len(models)} models were given: "
            "give a directory (each model's results go in a folder of its own name)"
        )


def check_chat_template(model: str) -> None:
    """Refuse (:class:`EvalError`) ``--apply_chat_template`` for a model whose tokenizer has
    none (one that cannot be loaded here is left to the run, which reports it)."""
    from tango.common.exceptions import ConfigurationError

    from .eval_results import chat_template

    try:
        template = chat_template(model)
    except ConfigurationError:  # reported where the run loads it
        return
    if template is None:
        raise EvalError(
            f"--apply_chat_template: the tokenizer of {model} has no chat template "
            "(tokenizer_config.json's chat_template); leave --apply_chat_template out"
        )


def make_output_folders(output_path: str, models: list[str]) -> None:
    """Make the folders ``--output_path`` writes the ``models``' results into, so that a path
    that cannot hold them fails before any work (:class:`EvalError`)."""
    for model in models:
        try:
            results_file(output_path, model, "DATE").parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise EvalError(f"--output_path {output_path}: {error}") from None


def per_model(args: argparse.Namespace) -> list[argparse.Namespace]:
    """The command's settings once for each model of ``args.models``, as ``model``."""
    return [argparse.Namespace(**{**vars(args), "model": model}) for model in args.models]


def release_models() -> None:
    """Free what the last run's model held before the next one loads: its steps are gone, so
    a collection releases the shared model (:mod:`~tango_fairscale.evaluation.shared_model`)
    and the device's cache gives its memory back."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def tango_arguments(args: argparse.Namespace, workspace: str, name: str) -> list[str]:
    """The ``tango`` command line (without the program) that evaluates ``args``; refuses
    (:class:`EvalError`) a value that Tango's ``-D`` cannot carry."""
    defines = {
        "model": args.model,
        "tasks": ",".join(args.tasks),
        "num_fewshot": "" if args.num_fewshot is None else str(args.num_fewshot),
        "limit": str(args.limit),
        "train_steps": "0",
    }
    if args.seed is not None:
        defines["fewshot_seed"] = str(args.seed)
    if args.gen_kwargs:
        defines["gen_kwargs"] = json.dumps(args.gen_kwargs)
    fields = ("precision", "device_count", "engine", "task_data_dir", "include_path")
    for field in (*fields, "system_instruction"):
        value = getattr(args, field)
        if value is not None:
            defines[field] = str(value)
    piqa_release = official_piqa(args)
    if piqa_release is not None:
        defines["data_dir"] = piqa_release
    if args.apply_chat_template:
        defines["apply_chat_template"] = "true"
    if args.fewshot_as_multiturn is not None:
        defines["fewshot_as_multiturn"] = str(args.fewshot_as_multiturn).lower()
    argv = ["--settings", str(SETTINGS), "run", str(CONFIG), "-w", workspace, "-n", name]
    for key, value in defines.items():
        if "=" in value:
            raise EvalError(f"'=' in {value!r}: Tango's -D values cannot hold one")
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


def official_piqa(args: argparse.Namespace) -> str | None:
    """``--task_data_dir``'s ``piqa`` folder when task ``piqa`` is asked for and that folder holds
    PIQA's official release files (as ``tango run``'s ``data_dir`` does): the config's ``data_dir``,
    read by the official files' reader, since they are not ``<split>.jsonl`` documents."""
    from .tasks.piqa import holds_release

    if args.task_data_dir is None or "piqa" not in args.tasks:
        return None
    folder = Path(args.task_data_dir).expanduser() / "piqa"
    return str(folder) if holds_release(folder) else None


def _tango(argv: list[str]) -> int:
    """``tango ARGV`` in this process (after :func:`check` has passed it), once or again."""
    import multiprocessing

    from tango.__main__ import main as tango_main
    from tango.common.exceptions import CliRunError

    from .runtime.collector import collect_less

    collect_less()  # as in ``tango run``'s own process
    # Tango sets the start method as it starts, which a second run in one process may not do.
    multiprocessing.set_start_method(None, force=True)
    try:
        # Tango's log and step table go where lm_eval's logs go: stdout is the results' alone.
        with contextlib.redirect_stdout(sys.stderr):
            tango_main(args=argv, prog_name="tango")
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except CliRunError:  # a step failed: Tango has shown which and why
        return 1
    return 0


def check(argv: list[str]) -> None:
    """Raise :class:`EvalError` with what ``tango ARGV`` (a ``run`` with ``--settings``) would
    refuse before any step, in one line: the config's own checks (a task listed twice), every
    missing input in one message (:mod:`~tango_fairscale.inputs`, as ``tango run`` checks them),
    those of building its steps (an unknown task, with the closest names), then a workspace that
    is not writable."""
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
        # The inputs first: building the steps fingerprints the model, and a model that cannot
        # be found fails there with Tango's own words.
        check_inputs(steps.as_dict(quiet=True), model_flag="--model DIR")
        import_module_and_submodules("tango_fairscale")  # tango.yml's include_package
        StepGraph.from_params(steps.duplicate())  # loads no model (see evaluation.shared_model)
        check_workspace_writable(run.workspace)
    except Exception as error:  # noqa: BLE001  (an unexpected one is raised again)
        brief = brief_message(error)
        if brief is None:
            raise
        raise EvalError(brief) from None
