"""train_speed.py's configuration names: ``ENGINE-PRECISION[-MODIFIER...]`` -> engine settings.

* ENGINE: ``ddp`` (a bare model at world size 1), ``fairscale``, ``fsdp2`` or ``pipe`` (ONE
  process, world size 1 only, its stages on ``--pipe-devices``).
* PRECISION: ``fp32`` (``32-true``), ``bf16`` (``bf16-mixed``), ``fp16`` / ``16-mixed``,
  ``bf16true`` (``bf16-true``), or a Lightning name as is.
* MODIFIERS (sharded engines): ``root`` (no per-block units), ``ckpt`` (activation checkpointing
  of every unit), ``offload`` (CPU offload), ``noflat``, ``noreshard``; also for ddp:
  ``compile`` (torch.compile per block), ``fused`` (fused AdamW), ``packed`` (PIQA data: the
  training step's ``pack_sequences``), ``float8`` / ``float8row`` (the engine's ``float8``:
  ``tensorwise`` / ``rowwise``).
* MODIFIERS (pipe): ``cN`` (N chunks = micro-batches, default 4), ``ckpt-always`` /
  ``ckpt-never`` / ``ckpt-except_last`` (default), ``bA_B`` (A and B blocks per stage; default
  automatic by parameter count), ``float8`` / ``float8row``.

:func:`engine_params` turns a parsed configuration into the ``Params`` of a registered Tango
``TrainingEngine`` (``tango_fairscale::<engine>``), as a config file would give them.
"""

from __future__ import annotations

import re
from typing import Any

import _bench

#: ``modules_to_wrap: []``: no inner units, the whole model is one root unit (catwalk's setting).
ROOT_ONLY_PATTERNS: list[str] = []

ENGINES = ("ddp", "fairscale", "fsdp2", "pipe")
FLOAT8_MODIFIERS = {"float8": "tensorwise", "float8row": "rowwise"}
MODIFIERS: tuple[str, ...] = ("root", "ckpt", "offload", "noflat", "noreshard", "compile", "fused")
MODIFIERS += ("packed", *FLOAT8_MODIFIERS)
#: Modifiers that are not sharding options (the DDP engine takes them too).
ENGINE_MODIFIERS = ("compile", "fused", "packed", *FLOAT8_MODIFIERS)
PIPE_CHECKPOINT_MODES = ("never", "always", "except_last")
PIPE_DEFAULT_CHUNKS = 4
LIGHTNING_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")


def parse_config(name: str) -> dict[str, Any]:
    """``fairscale-bf16-ckpt`` -> engine, precision, sharding (errors say what to change)."""
    engine, _, rest = name.partition("-")
    if engine not in ENGINES:
        raise SystemExit(f"config {name!r}: engine must be one of {', '.join(ENGINES)}")
    precision = next(
        (p for p in LIGHTNING_PRECISIONS if rest == p or rest.startswith(p + "-")), None
    )
    if precision is not None:
        rest = rest[len(precision) :].lstrip("-")
    else:
        token, _, rest = rest.partition("-")
        if token not in _bench.PRECISION_ALIASES:
            raise SystemExit(
                f"config {name!r}: precision {token!r} unknown; use one of "
                f"{', '.join(_bench.PRECISION_ALIASES)} or {', '.join(LIGHTNING_PRECISIONS)}"
            )
        precision = _bench.PRECISION_ALIASES[token]
    modifiers = [m for m in rest.split("-") if m]
    if engine == "pipe":
        return {
            "config": name,
            "engine": engine,
            "precision": precision,
            "sharding": None,
            **parse_pipe_modifiers(name, modifiers),
        }
    unknown = [m for m in modifiers if m not in MODIFIERS]
    if unknown:
        raise SystemExit(f"config {name!r}: unknown modifier(s) {unknown}; use {MODIFIERS}")
    sharding_only = [m for m in modifiers if m not in ENGINE_MODIFIERS]
    if engine == "ddp" and sharding_only:
        raise SystemExit(f"config {name!r}: {sharding_only} apply to sharded engines only")
    if "root" in modifiers and "ckpt" in modifiers:
        raise SystemExit(f"config {name!r}: 'ckpt' checkpoints the units, and 'root' has none")
    sharding: dict[str, Any] = {}
    if "root" in modifiers:
        sharding["modules_to_wrap"] = ROOT_ONLY_PATTERNS
    if "ckpt" in modifiers:
        sharding["activation_checkpointing"] = True
    if "offload" in modifiers:
        sharding["cpu_offload"] = True
    if "noflat" in modifiers:
        sharding["flatten_parameters"] = False
    if "noreshard" in modifiers:
        sharding["reshard_after_forward"] = False
    if "compile" in modifiers and engine in ("fairscale", "fsdp2"):
        sharding["compile"] = True
    return {
        "config": name,
        "engine": engine,
        "precision": precision,
        "modifiers": modifiers,
        "sharding": sharding if engine != "ddp" else None,
    }


def parse_pipe_modifiers(name: str, tokens: list[str]) -> dict[str, Any]:
    """``c8``, ``ckpt-always`` / ``ckpt-never`` / ``ckpt-except_last``, ``b8_4`` (blocks per
    stage; default automatic), ``float8`` / ``float8row`` -> the pipe's settings."""
    pipe: dict[str, Any] = {
        "chunks": PIPE_DEFAULT_CHUNKS,
        "checkpoint": "except_last",
        "balance": None,
    }
    modifiers: list[str] = []
    seen: set[str] = set()
    tokens = list(tokens)
    while tokens:
        token = tokens.pop(0)
        if re.fullmatch(r"c[1-9][0-9]*", token) and "c" not in seen:
            pipe["chunks"] = int(token[1:])
            modifiers.append(token)
            seen.add("c")
        elif re.fullmatch(r"b[1-9][0-9]*(_[1-9][0-9]*)+", token) and "b" not in seen:
            pipe["balance"] = [int(n) for n in token[1:].split("_")]
            modifiers.append(token)
            seen.add("b")
        elif (
            token == "ckpt" and tokens and tokens[0] in PIPE_CHECKPOINT_MODES and "ckpt" not in seen
        ):
            pipe["checkpoint"] = tokens.pop(0)
            modifiers.append(f"ckpt-{pipe['checkpoint']}")
            seen.add("ckpt")
        elif token in FLOAT8_MODIFIERS and "float8" not in seen:
            modifiers.append(token)
            seen.add("float8")
        else:
            raise SystemExit(
                f"config {name!r}: pipe modifier {token!r} unknown or repeated; use cN "
                f"(chunks, default {PIPE_DEFAULT_CHUNKS}) and ckpt-MODE "
                f"(MODE: {', '.join(PIPE_CHECKPOINT_MODES)}; default except_last), bA_B "
                "(blocks per stage; default automatic), float8 / float8row, e.g. "
                "pipe-bf16-c8-ckpt-always"
            )
    return {"modifiers": modifiers, "pipe": pipe}


def engine_params(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``Params`` of the registered engine that ``spec``'s configuration names, optimizer
    included (AdamW, no weight decay; ``fused`` for ``-fused`` configurations)."""
    modifiers = spec.get("modifiers") or []
    adamw: dict[str, Any] = {"type": "torch::AdamW", "lr": spec["lr"], "weight_decay": 0.0}
    if "fused" in modifiers:
        adamw["fused"] = True
    params: dict[str, Any] = {
        "type": f"tango_fairscale::{spec['engine']}",
        "precision": spec["precision"],
        "max_grad_norm": spec["max_grad_norm"],
        "optimizer": adamw,
    }
    for modifier, recipe in FLOAT8_MODIFIERS.items():
        if modifier in modifiers:
            params["float8"] = recipe
    if spec["engine"] == "pipe":
        # One process drives every stage; balance automatic unless the config names one.
        params["pipe"] = {
            "devices": spec["pipe_devices"],
            "chunks": spec["pipe"]["chunks"],
            "checkpoint": spec["pipe"]["checkpoint"],
            "balance": spec["pipe"]["balance"],
        }
    elif spec["engine"] != "ddp":
        params["sharding"] = dict(spec["sharding"])
    elif "compile" in modifiers:
        params["compile"] = True
    return params


def pipe_devices(spec_devices: str, cuda: bool, gpus: int) -> list[str]:
    """``--pipe-devices``: ``all`` = every visible GPU (two CPU stages without GPUs)."""
    if spec_devices != "all":
        return [d.strip() for d in spec_devices.split(",") if d.strip()]
    if cuda:
        return [f"cuda:{i}" for i in range(gpus)]
    return ["cpu", "cpu"]


def count_parameters(model_config: dict[str, Any]) -> int:
    """Unique parameters of the Hugging Face model (meta device: no memory, no init)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(model_config)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def piqa_rank_batches(
    examples: list[dict[str, Any]], batch_size: int, world_size: int, n_steps: int, seed: int
) -> list[list[list[dict[str, Any]]]]:
    """``[rank][step]`` -> that rank's PIQA examples, as the training step's schedule picks them.

    ``batch_size`` is per GPU: the global batch is ``batch_size x world_size`` (no gradient
    accumulation), so every configuration of one world size trains on the same examples.
    """
    from tango_fairscale.data.schedules import BatchSchedule

    batches = []
    for rank in range(world_size):
        schedule = BatchSchedule(len(examples), batch_size * world_size, seed, world_size, rank)
        batches.append(
            [[examples[i] for i in schedule.micro_batches(step)[0]] for step in range(n_steps)]
        )
    return batches
