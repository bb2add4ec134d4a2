"""``tango-fairscale eval``'s arguments resolved after parsing, before any work: lm_eval's
``--model hf --model_args`` and ``--gen_kwargs`` forms, its chat settings and ``--device``; what
cannot be taken is refused as an :class:`EvalError` (one line, exit code 2)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .eval_arguments import DTYPE_PRECISIONS, LM_EVAL_HF_MODELS, MODEL_ARGS, PRECISIONS


class EvalError(Exception):
    """A problem the command reports in one line (exit code 2)."""


def take_model_args(args: argparse.Namespace) -> None:
    """Resolve lm_eval's ``--model hf --model_args pretrained=...,dtype=...`` (``hf``: lm_eval's
    default) into ``args.models`` (one model) and ``args.precision``; ``--model PATH...`` stays
    as given. Refuse (:class:`EvalError`) what the package does not take, a model listed twice
    among them."""
    models = args.models or []
    if not models and args.model_args is None:
        raise EvalError(
            "give the model: --model PATH_OR_ID, or lm_eval's --model_args pretrained=PATH_OR_ID"
        )
    hf_backend = not models or (
        len(models) == 1 and models[0] in LM_EVAL_HF_MODELS and not Path(models[0]).exists()
    )
    if args.model_args is None:
        if hf_backend:
            raise EvalError(
                f"--model {models[0]} names lm-eval's Hugging Face backend: give the model as "
                "--model_args pretrained=PATH_OR_ID, or as --model PATH_OR_ID"
            )
        same = [_same_model(model) for model in models]
        repeated = sorted({m for m, key in zip(models, same, strict=True) if same.count(key) > 1})
        if repeated:
            raise EvalError(f"--model lists {repeated[0]} more than once; list each model once")
        return
    if not hf_backend:
        raise EvalError(
            f"--model_args goes with lm_eval's --model hf, not with --model {' '.join(models)}: "
            "leave it out, or pass --model hf --model_args pretrained=PATH_OR_ID"
        )
    given = key_values("--model_args", args.model_args)
    unknown = [key for key in given if key not in MODEL_ARGS]
    if unknown:
        raise EvalError(
            f"--model_args: {', '.join(unknown)} not taken (taken: {', '.join(MODEL_ARGS)})"
        )
    if given.get("trust_remote_code"):
        raise EvalError(
            "--model_args trust_remote_code=True: models are loaded without running code from "
            "their files; use a model whose architecture transformers includes"
        )
    if not given.get("pretrained"):
        raise EvalError("--model_args names no model: give pretrained=PATH_OR_ID")
    args.models = [str(given["pretrained"])]
    if "dtype" in given:
        dtype = str(given["dtype"])
        precision = DTYPE_PRECISIONS.get(dtype)
        if precision is None:
            raise EvalError(
                f"--model_args dtype={dtype}: take float32, bfloat16 or auto, or --precision "
                f"({', '.join(PRECISIONS)}; 16-mixed scores float16 under autocast)"
            )
        if args.precision not in (None, precision):
            raise EvalError(
                f"--model_args dtype={dtype} is --precision {precision}, and --precision "
                f"{args.precision} was given: give one of them"
            )
        args.precision = precision


def _same_model(model: str) -> str:
    """What tells two ``--model`` values apart: a local directory's real path, else the id."""
    return os.path.realpath(model) if Path(model).exists() else model


def take_gen_kwargs(args: argparse.Namespace) -> None:
    """Resolve lm_eval's ``--gen_kwargs`` values into a dict (``None`` without them); refuse
    (:class:`EvalError`) what lm_eval cannot read."""
    if args.gen_kwargs is not None:
        args.gen_kwargs = key_values("--gen_kwargs", args.gen_kwargs) or None


def check_chat(args: argparse.Namespace) -> None:
    """Refuse (:class:`EvalError`) chat settings the package does not take: a chat template by
    name (the tokenizer's default one is used), few-shot turns without a chat template (as
    lm_eval refuses them)."""
    if args.apply_chat_template not in (True, False):
        raise EvalError(
            f"--apply_chat_template {args.apply_chat_template}: templates are not chosen by name "
            "here (the tokenizer's default one is used); leave the name out"
        )
    if args.fewshot_as_multiturn and not args.apply_chat_template:
        raise EvalError("--fewshot_as_multiturn needs --apply_chat_template (turns of a chat)")


def key_values(option: str, values: list[str]) -> dict[str, Any]:
    """A dict option's values as ``lm_eval`` reads them (its ``MergeDictAction``, lm-eval's own
    functions): one JSON object, or ``key=value`` items, comma-separated or apart, each value a
    Python literal where it is one (``until=["\\n"]``); refused (:class:`EvalError`) otherwise."""
    from lm_eval._cli.utils import key_val_to_dict, try_parse_json

    try:
        first = try_parse_json(values[0])
        if isinstance(first, dict):
            return first
        merged: dict[str, Any] = {}
        for value in values:
            merged.update(key_val_to_dict(value))
    except ValueError as error:
        raise EvalError(f"{option}: {error}") from None  # lm-eval's messages are one line
    return merged


def use_device(device: str) -> None:
    """Make ``device`` (``cpu``, ``cuda`` or ``cuda:N``) the one scoring runs on, through
    ``CUDA_VISIBLE_DEVICES`` (so call before CUDA starts: this process's scoring and any worker
    it spawns see it); refuse (:class:`EvalError`) a GPU that is not there."""
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return
    index = int(device.partition(":")[2] or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        listed = [item.strip() for item in visible.split(",") if item.strip()]
        chosen = listed[index] if index < len(listed) else None
    else:
        chosen = str(index)
    import torch

    if chosen is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = chosen
    if chosen is None or not torch.cuda.is_available():
        raise EvalError(f"--device {device}: this machine has no such GPU visible")
