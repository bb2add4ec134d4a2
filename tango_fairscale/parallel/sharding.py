"""Which modules become sharding units and which are activation-checkpointed (chosen by regex),
and the order in which the sharded engines wrap them.

Module names are relative to the :class:`~tango_fairscale.model.causal_lm.ModelWrapper`, e.g.
``model.transformer.h.0`` for GPT-2's first block. Patterns match whole names (``re.fullmatch``).
The selection functions are pure: they inspect the model and return names, or raise a one-line
``ConfigurationError`` that says what to change.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tango.common import FromParams, Params
from tango.common.exceptions import ConfigurationError

from ..checks import boolean


@dataclass
class ShardingConfig(FromParams):
    """How a sharded engine (``fairscale`` or ``fsdp2``) splits and stores the model.

    :param modules_to_wrap: regexes of module names that become their own sharding unit, e.g.
        ``["model\\.transformer\\.h\\.[0-9]+"]`` for each GPT-2 block; an empty list shards the
        whole model as one unit (the root). The default (``null``) decides by size: each
        transformer block of the loaded model (its ``_no_split_modules``) is a unit when blocks
        hold at least :data:`MIN_BLOCK_UNIT_PARAMS` parameters or activation checkpointing is
        on, else the whole model is one unit: a unit costs
        hooks and collectives on every step, which small blocks do not repay in memory.
    :param activation_checkpointing: recompute activations in the backward pass instead of storing
        them: ``true`` for every module in ``modules_to_wrap``, or a list of regexes.
    :param reshard_after_forward: free gathered parameters after each unit's forward (less memory,
        one more all-gather in the backward pass).
    :param flatten_parameters: one flat parameter per unit (FairScale only; FSDP2 never flattens).
    :param cpu_offload: keep the sharded parameters and gradients in CPU memory.
    :param compile: ``torch.compile`` each unit, after checkpointing, before sharding (each
        transformer block when the whole model is one unit).
    :param hybrid_shard: shard within each node and replicate across nodes (FSDP2 only): the
        all-gathers stay on the fast links inside a node; only gradients cross nodes. Nodes are
        the launcher's (``LOCAL_WORLD_SIZE`` processes each); one node shards over every process.
    """

    modules_to_wrap: list[str] | None = None
    activation_checkpointing: bool | list[str] = False
    reshard_after_forward: bool = True
    flatten_parameters: bool = True
    cpu_offload: bool = False
    compile: bool = False
    hybrid_shard: bool = False

    def __post_init__(self) -> None:
        flags = (
            "reshard_after_forward",
            "flatten_parameters",
            "cpu_offload",
            "compile",
            "hybrid_shard",
        )
        for name in flags:
            boolean(f"sharding.{name}", getattr(self, name))
        if self.modules_to_wrap is not None and not isinstance(self.modules_to_wrap, list):
            raise ConfigurationError(_not_a_list("modules_to_wrap", self.modules_to_wrap))
        patterns = list(self.modules_to_wrap or [])
        if isinstance(self.activation_checkpointing, list):
            patterns += self.activation_checkpointing
        elif not isinstance(self.activation_checkpointing, bool):
            raise ConfigurationError(
                "activation_checkpointing must be true, false or a list of regexes, got "
                f"{self.activation_checkpointing!r}"
            )
        for pattern in patterns:
            compile_pattern(pattern)
        if self.activation_checkpointing is True and self.modules_to_wrap == []:
            raise ConfigurationError(
                "sharding.activation_checkpointing: true checkpoints the modules of "
                "modules_to_wrap, which is empty (the whole model is one unit): remove "
                "modules_to_wrap (each transformer block) or list the modules to wrap"
            )

    @classmethod
    def from_params(  # type: ignore[override]
        cls, params_: Any, *args: Any, **kwargs: Any
    ) -> ShardingConfig:
        # Tango would turn a string given for a list into the list of its characters.
        fields = params_.as_dict(quiet=True) if isinstance(params_, Params) else params_
        for name in ("modules_to_wrap", "activation_checkpointing"):
            if isinstance(fields, dict) and isinstance(fields.get(name), str):
                raise ConfigurationError(_not_a_list(name, fields[name]))
        return super().from_params(params_, *args, **kwargs)


def _not_a_list(name: str, value: object) -> str:
    return f"sharding.{name} must be a list of regexes, got {value!r}; write [{value!r}]"


def compile_pattern(pattern: str) -> re.Pattern:
    if not isinstance(pattern, str):
        raise ConfigurationError(f"module patterns must be strings, got {pattern!r}")
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ConfigurationError(
            f"module pattern {pattern!r} is not a valid regex: {error}"
        ) from None


#: Parameters a transformer block must hold to become its own sharding unit by default (GPT-2
#: 1.5B's blocks hold 31 M and are units; 124M's hold 7 M and are not). Measured on one H200, PIQA
#: batches of 16 on GPT-2 124M: FairScale per block 47.8 ms a step, one unit 33.0 ms.
MIN_BLOCK_UNIT_PARAMS = 20_000_000


def default_unit_patterns(model: torch.nn.Module) -> list[str]:
    """One pattern per transformer-block class of a Hugging Face model (``_no_split_modules``)."""
    block_classes: set[str] = set()
    for module in model.modules():
        block_classes.update(getattr(module, "_no_split_modules", None) or [])
    names = [n for n, m in model.named_modules() if type(m).__name__ in block_classes]
    if not names:
        raise ConfigurationError(
            f"{type(model).__name__} names no transformer block classes (_no_split_modules); "
            "set modules_to_wrap to regexes of the modules to shard separately"
        )
    return [re.escape(name) for name in names]


def select_modules(model: torch.nn.Module, patterns: Sequence[str], field_name: str) -> list[str]:
    """Names of the modules matched by ``patterns``, deepest first (so nesting wraps inner first).

    Every pattern must match at least one module; the error lists the closest module names.
    The root (empty name) can not be selected: it is always a unit of its own.
    """
    names = [name for name, _ in model.named_modules() if name]
    selected: set[str] = set()
    for pattern in patterns:
        regex = compile_pattern(pattern)
        matched = [name for name in names if regex.fullmatch(name)]
        if not matched:
            close = difflib.get_close_matches(pattern.replace("\\", ""), names, n=4, cutoff=0.3)
            hint = f"; close module names: {', '.join(close)}" if close else ""
            raise ConfigurationError(
                f"{field_name} pattern {pattern!r} matches no module (patterns must match whole "
                f"names, e.g. 'model\\.transformer\\.h\\.[0-9]+'){hint}"
            )
        selected.update(matched)
    return sorted(selected, key=lambda name: (-name.count("."), name))


def check_tied_parameters(model: torch.nn.Module, unit_names: Sequence[str]) -> None:
    """Refuse units that would split a tied parameter (e.g. GPT-2's input/output embeddings).

    A parameter shared by several modules must live in one sharding unit: the deepest wrapped
    ancestor of every module using it must be the same.
    """
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        for parameter in module.parameters(recurse=False):
            owners.setdefault(id(parameter), []).append(name)
    units = sorted(unit_names, key=len, reverse=True)

    def unit_of(module_name: str) -> str:
        for unit in units:
            if module_name == unit or module_name.startswith(unit + "."):
                return unit
        return "<root>"

    for modules in owners.values():
        homes = {unit_of(name) for name in modules}
        if len(homes) > 1:
            raise ConfigurationError(
                f"tied parameter shared by {' and '.join(modules)} would be split across sharding "
                f"units {', '.join(sorted(homes))}; change modules_to_wrap so that both modules "
                "are inside the same unit (or neither is wrapped)"
            )


def selected_units(model: torch.nn.Module, config: ShardingConfig) -> tuple[list[str], list[str]]:
    """``(units, checkpointed)``: module names to shard and to checkpoint, deepest first, checked
    against the model (patterns must match, tied parameters must stay in one unit)."""
    if config.modules_to_wrap is None:
        blocks = select_modules(model, default_unit_patterns(model), "modules_to_wrap")
        units = blocks if blocks_are_units(model, blocks, config) else []
    else:
        units = select_modules(model, config.modules_to_wrap, "modules_to_wrap")
    check_tied_parameters(model, units)
    checkpointed: list[str] = []
    if config.activation_checkpointing is True:
        checkpointed = units
    elif config.activation_checkpointing:
        checkpointed = select_modules(
            model, config.activation_checkpointing, "activation_checkpointing"
        )
    return units, checkpointed


def blocks_are_units(model: torch.nn.Module, blocks: Sequence[str], config: ShardingConfig) -> bool:
    """The default unit policy: transformer blocks are units when any module is
    activation-checkpointed or when the smallest holds :data:`MIN_BLOCK_UNIT_PARAMS`."""
    if config.activation_checkpointing:  # FairScale checkpoints whole units only
        return True
    sizes = [sum(p.numel() for p in model.get_submodule(name).parameters()) for name in blocks]
    return min(sizes) >= MIN_BLOCK_UNIT_PARAMS


def replace_module(root: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    """Put ``new`` where the submodule ``name`` of ``root`` is."""
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name), child, new)


def apply_checkpointing(
    model: torch.nn.Module,
    checkpointed: Sequence[str],
    checkpoint: Callable[[torch.nn.Module], torch.nn.Module],
) -> None:
    """Put ``checkpoint(module)`` in place of each module of ``model`` named in ``checkpointed``."""
    for name in checkpointed:
        replace_module(model, name, checkpoint(model.get_submodule(name)))


def has_compiled_module(model: torch.nn.Module) -> bool:
    """Whether any module of ``model`` was compiled in place (``Module.compile``)."""
    return any(getattr(module, "_compiled_call_impl", None) for module in model.modules())


def apply_sharding(
    model: torch.nn.Module,
    units: Sequence[str],
    checkpointed: Sequence[str],
    *,
    checkpoint: Callable[[torch.nn.Module], torch.nn.Module],
    shard: Callable[[torch.nn.Module], torch.nn.Module],
    compile: bool,
) -> torch.nn.Module:
    """Wrap ``model`` in torchtitan's order: activation checkpointing on ``checkpointed``, then
    ``torch.compile`` (only the unit's own computation: the sharding hooks stay eager; each
    transformer block when the root is the only unit), then ``shard`` on each of ``units``
    (deepest first), then ``shard`` on the root."""
    apply_checkpointing(model, checkpointed, checkpoint)
    if compile and not units:
        for name in select_modules(model, default_unit_patterns(model), "compile"):
            model.get_submodule(name).compile()
    for name in units:
        unit = model.get_submodule(name)
        if compile:
            unit.compile()
        replace_module(model, name, shard(unit))
    return shard(model)
