"""The optimizer an engine builds over its wrapped model's parameters: fused on a GPU unless the
config chooses."""

from __future__ import annotations

from typing import Any

import torch
from tango.common import Lazy
from tango.integrations.torch import Optimizer


def build_optimizer(
    optimizer: Lazy[Optimizer], parameters: list[torch.nn.Parameter], fused_allowed: bool = True
) -> Optimizer:
    """``optimizer`` over ``parameters``; on a GPU, fused (one kernel for every parameter's update
    instead of a few per tensor) when its class takes ``fused``, the config sets neither
    ``fused`` nor ``foreach``, no parameter is offloaded to the CPU and ``fused_allowed``.
    Fused and per-tensor updates round differently, so CPUs keep the per-tensor update that the
    parity tests compare bitwise."""
    extras: dict[str, Any] = {}
    on_gpu = bool(parameters) and all(p.is_cuda for p in parameters)  # not CPU-offloaded
    if on_gpu and fused_allowed and fused_by_default(optimizer):
        extras["fused"] = True
    return optimizer.construct(params=parameters, **extras)


def fused_by_default(optimizer: Lazy[Optimizer]) -> bool:
    """Whether ``optimizer`` (a config not yet built) takes ``fused`` and leaves both ``fused``
    and ``foreach`` unset."""
    import inspect

    params = optimizer._params  # the config as written; Tango's Lazy keeps no public view
    given = params.as_dict(quiet=True) if hasattr(params, "as_dict") else dict(params or {})
    if "fused" in given or "foreach" in given:
        return False
    name = given.get("type")
    cls: Any
    if isinstance(name, str) and name in Optimizer.list_available():
        cls = Optimizer.resolve_class_name(name)[0]
    else:
        cls = optimizer._constructor  # a Lazy built from a class, not from a config
    return inspect.isclass(cls) and "fused" in inspect.signature(cls).parameters
