"""``tango-fairscale eval``'s arguments: its parser, with the forms of ``lm_eval``'s command line
it takes (``--model hf --model_args``, ``--batch_size auto``, ``--device``, ``--seed``), each
checked as it is parsed; :mod:`tango_fairscale.eval_cli` runs the command."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .evaluation import DEFAULT_BATCH_SIZE
from .parallel import ENGINES, PRECISIONS

#: lm-eval's names of its Hugging Face backend: ``--model hf --model_args pretrained=...``.
LM_EVAL_HF_MODELS = ("hf", "hf-auto", "huggingface")
#: lm-eval's ``dtype`` model argument (a torch dtype's name, or auto) -> the package's precision.
DTYPE_PRECISIONS = {
    "float32": "32-true",
    "float": "32-true",
    "bfloat16": "bf16-true",
    "auto": "auto",
}
#: The ``--model_args`` keys taken (lm-eval's HF backend has more).
MODEL_ARGS = ("pretrained", "dtype", "trust_remote_code")


def default_workspace() -> Path:
    """``$XDG_CACHE_HOME/tango-fairscale/workspace`` (``~/.cache/...`` without it)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tango-fairscale" / "workspace"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``eval`` subcommand's parser, under ``commands``."""
    parser = commands.add_parser(
        "eval",
        allow_abbrev=False,  # lm_eval's --device must not be taken for --device_count
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
    parser.add_argument(
        "--log_samples",
        "-s",
        action="store_true",
        help="with --output_path: also each document's samples, as lm_eval writes them "
        "(samples_<task>_<date>.jsonl beside the results; each task is loaded again for its "
        "documents)",
    )


def _add_model(parser: argparse.ArgumentParser) -> None:
    """``--model`` and lm_eval's ``--model_args``."""
    parser.add_argument(
        "--model",
        "-M",
        dest="models",
        nargs="+",
        action="extend",  # --model A --model B: both
        metavar="PATH_OR_ID",
        help="model directory or hub id, or several (checkpoints of a run: each scored in turn "
        "by this one process, on requests built once); or lm_eval's 'hf' (its default) with "
        "--model_args",
    )
    parser.add_argument(
        "--model_args",
        "-a",
        nargs="+",
        metavar="pretrained=PATH_OR_ID[,dtype=D]",
        help="lm_eval's model arguments for its hf model ('k=v,k2=v2', 'k=v k2=v2' or JSON): "
        "the model, and optionally its dtype (float32, bfloat16 or auto: --precision 32-true, "
        "bf16-true or auto)",
    )


def _add_chat(parser: argparse.ArgumentParser) -> None:
    """lm_eval's chat formatting: ``--apply_chat_template``, ``--fewshot_as_multiturn``,
    ``--system_instruction``."""
    parser.add_argument(
        "--apply_chat_template",
        nargs="?",
        const=True,
        default=False,
        metavar="TEMPLATE",
        help="prompts in the tokenizer's chat template, as lm_eval writes them (its default "
        "template: no name)",
    )
    parser.add_argument(
        "--fewshot_as_multiturn",
        nargs="?",
        const=True,
        type=_boolean,
        metavar="BOOL",
        help="few-shot examples as chat turns (default: true with --apply_chat_template)",
    )
    parser.add_argument(
        "--system_instruction", metavar="TEXT", help="a system prompt, as lm_eval adds it"
    )


def _add_settings(parser: argparse.ArgumentParser) -> None:
    """The options that become the config's variables (and ``--batch_size``'s override)."""
    _add_model(parser)
    _add_chat(parser)
    _add_tasks(parser)
    parser.add_argument(
        "--precision", choices=PRECISIONS, help="scoring precision (default: tango.yml's, auto)"
    )
    parser.add_argument(
        "--batch_size",
        type=_batch_size,
        metavar="B",
        help=f"queries per scoring batch (default {DEFAULT_BATCH_SIZE}, also for lm_eval's auto "
        "and auto:N; speed only: not cached)",
    )
    parser.add_argument(
        "--device",
        type=_device,
        metavar="DEVICE",
        help="cuda, cuda:N or cpu: where scoring runs (default: the first GPU when there is one)",
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


def _add_tasks(parser: argparse.ArgumentParser) -> None:
    """The tasks and what they read: ``--tasks``, ``--num_fewshot``, ``--seed``, ``--limit``,
    ``--gen_kwargs``, ``--include_path``, ``--task_data_dir``."""
    parser.add_argument(
        "--tasks",
        "-t",
        required=True,
        nargs="+",
        action=_TaskNames,
        metavar="TASK[,TASK...]",
        help="lm-eval task, group or tag names, separated by commas or spaces",
    )
    parser.add_argument(
        "--num_fewshot",
        type=_whole_number,
        metavar="K",
        help="few-shot examples per context (default: each task's own, as lm_eval)",
    )
    parser.add_argument(
        "--seed",
        type=_fewshot_seed,
        metavar="S|R,N,T[,F]",
        help="lm_eval's seeds (python, numpy, torch, few-shot; one value for all four): the "
        "few-shot one picks the few-shot examples (default 1234); nothing scored draws on the "
        "others",
    )
    parser.add_argument(
        "--limit",
        type=_document_count,
        default=0,
        metavar="N",
        help="at most N documents per task, or that fraction of each (0 < N < 1, rounded up), "
        "as lm_eval (default 0: all)",
    )
    parser.add_argument(
        "--gen_kwargs",
        nargs="+",
        metavar="KEY=VALUE",
        help="generation settings laid over each generate_until task's own, as lm_eval takes "
        "them ('max_gen_toks=64,until=[\"\\n\"]', or a JSON object)",
    )
    parser.add_argument(
        "--include_path",
        metavar="DIR",
        help="a folder of task YAMLs of your own: --tasks names are looked up there first, as "
        "lm_eval does (its tasks; not its groups or tags)",
    )
    parser.add_argument(
        "--task_data_dir",
        metavar="DIR",
        help="local task data: DIR/<task>/<split>.jsonl, or PIQA's official release files in "
        "DIR/piqa (default: the tasks' hub datasets)",
    )


class _TaskNames(argparse.Action):
    """``--tasks``: names separated by commas or spaces, as lm_eval takes them."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        names = [name.strip() for value in values for name in value.split(",") if name.strip()]
        if not names:
            parser.error(f"argument {option_string}: names no task: {' '.join(values)!r}")
        setattr(namespace, self.dest, (getattr(namespace, self.dest) or []) + names)


def _whole_number(text: str, least: int = 0) -> int:
    """``text`` as a whole number of at least ``least``."""
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"must be a whole number >= {least}, got {text!r}")
    return value


def _document_count(text: str) -> int | float:
    """``--limit``: a whole number of documents, or a fraction of each task's (0 < N < 1), as
    lm_eval takes it."""
    try:
        fraction = float(text)
    except ValueError:
        fraction = 0.0
    if 0 < fraction < 1:
        return fraction
    try:
        return _whole_number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of documents >= 0 or a fraction between 0 and 1, got {text!r}"
        ) from None


def _fewshot_seed(text: str) -> int:
    """The few-shot seed of lm_eval's ``--seed`` (``S``, or ``R,N,T[,F]``: its fourth value,
    1234 when three are given)."""
    values = [value.strip() for value in text.split(",")]
    if len(values) not in (1, 3, 4):
        raise argparse.ArgumentTypeError(
            f"one integer or a comma-separated list of 3 or 4, as lm_eval takes, got {text!r}"
        )
    chosen = values[0] if len(values) == 1 else values[3] if len(values) == 4 else "1234"
    if chosen == "None":
        raise argparse.ArgumentTypeError(
            "the few-shot seed cannot be None here (the choice of examples is cached): give an "
            f"integer, got {text!r}"
        )
    if not all(value == "None" or value.lstrip("-").isdigit() for value in values):
        raise argparse.ArgumentTypeError(f"integers or None, as lm_eval takes, got {text!r}")
    return int(chosen)


def _positive(text: str) -> int:
    return _whole_number(text, least=1)


def _batch_size(text: str) -> int | None:
    """A positive whole number, or lm_eval's ``auto`` / ``auto:N`` (``None``: the default)."""
    if text == "auto" or (text.startswith("auto:") and text[5:].isdigit()):
        return None
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a positive whole number, auto or auto:N, got {text!r}"
        ) from None


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")


def _device(text: str) -> str:
    if text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"must be cuda, cuda:N or cpu, got {text!r}")


def _home(path: Path) -> str:
    home = os.path.expanduser("~")
    text = str(path)
    return "~" + text[len(home) :] if text.startswith(home + os.sep) else text
