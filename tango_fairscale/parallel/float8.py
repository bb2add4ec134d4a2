"""Float8 matrix multiplications in training (torchao's dynamic scaling): the transformer blocks'
projections swapped for float8 ones before compilation and sharding, everything else (embeddings,
the vocabulary projection, attention, norms) left in the precision's dtype.

The swapped modules keep their parameters, names and shapes (GPT-2's ``Conv1D`` included), so
checkpoints, exports and sharding are as without float8; only the matmuls' inputs are scaled and
cast to float8 on the fly (e4m3 forward, e5m2 gradients for ``tensorwise``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from tango.common.exceptions import ConfigurationError

from .. import compat  # noqa: F401  (the fixes; transformers' before it is imported)
from ..checks import one_of
from .precision import Precision
from .sharding import default_unit_patterns, has_compiled_module, select_modules

logger = logging.getLogger(__name__)

#: torchao's recipes: ``tensorwise`` (one scale per tensor, cuBLAS's kernel; the one measured
#: here) and ``rowwise`` (a scale per row, CUTLASS's kernel; by torchao's own measurements more
#: accurate and slower).
FLOAT8_RECIPES = ("tensorwise", "rowwise")
TORCHAO = "torchao==0.18.0"


def check_float8_setting(recipe: str, precision: str) -> None:
    """Refuse (one line) a float8 ``recipe`` unknown or with a ``precision`` (its name) float8
    cannot compute around; told from the config alone."""
    one_of("float8", recipe, FLOAT8_RECIPES)
    if precision not in ("auto", "bf16-mixed", "bf16-true"):
        raise ConfigurationError(
            f"float8 computes around bf16: set precision to 'bf16-mixed' (or 'bf16-true'), "
            f"not {precision!r}, or remove float8"
        )


def check_float8_machine() -> None:
    """Refuse (one line) float8 on a machine without CUDA GPUs, told without starting CUDA (in
    the launching process; :func:`check_float8` checks each device where the engine is built)."""
    if not torch.cuda.is_available():
        raise ConfigurationError(_needs_float8_gpus("this machine has none"))


def check_float8(recipe: str, precision: Precision, devices: Sequence[torch.device]) -> None:
    """Refuse (one line) a float8 setting this run cannot train with: a device it computes on
    without float8 kernels, then :func:`check_float8_setting` with the resolved precision,
    torchao missing."""
    for device in devices:
        if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
            raise ConfigurationError(_needs_float8_gpus(f"{device} is not one"))
    # After the device: ``auto`` resolves to bf16-mixed on every GPU with float8 kernels.
    check_float8_setting(recipe, precision.name)
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise ConfigurationError(f"float8 needs torchao: pip install {TORCHAO}") from None


def _needs_float8_gpus(why: str) -> str:
    return (
        "float8 needs NVIDIA GPUs with float8 tensor cores (compute capability 8.9 or later: "
        f"H100, H200, L4, L40, RTX 40xx), and {why}; remove float8"
    )


class Float8Conv1D(torch.nn.Module):
    """Hugging Face's ``Conv1D`` (GPT-2's projections: ``x @ weight + bias``, weight ``(in,
    out)``) with torchao's float8 matmul, which takes that weight as the transposed linear one it
    multiplies by."""

    def __init__(self, conv: torch.nn.Module, config: Any) -> None:
        super().__init__()
        from torchao.float8.float8_linear import Float8Linear

        self.nf = conv.nf
        self.weight, self.bias = conv.weight, conv.bias
        # The three matmuls' settings as torchao's own layer derives them from the config.
        self.mm_config = Float8Linear(
            1, 1, bias=False, config=config, device="meta"
        ).linear_mm_config
        self.config = config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        out = matmul_with_hp_or_float8_args.apply(x, self.weight, self.mm_config, self.config)
        return out + self.bias.to(out.dtype)


def apply_float8(model: torch.nn.Module, recipe: str, *, emulate: bool = False) -> int:
    """Swap the linear layers (``nn.Linear`` and GPT-2's ``Conv1D``) inside ``model``'s transformer
    blocks whose dimensions are multiples of 16 (float8's kernels need them) for float8 ones;
    ``emulate``: float8's rounding computed in high precision (CPUs, tests). Returns how many were
    swapped; refuses (one line) a model where none can be."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from transformers.pytorch_utils import Conv1D

    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = Float8LinearConfig(**{**config.__dict__, "emulate": True})
    swapped = 0

    def fits(module: torch.nn.Module, _name: str = "") -> bool:
        nonlocal swapped
        # Exact types: a nested block's layers already swapped (torchao's layer is an nn.Linear)
        # are not swapped again.
        takes = type(module) in (torch.nn.Linear, Conv1D)
        takes = takes and all(size % 16 == 0 for size in module.weight.shape)  # type: ignore[union-attr]
        swapped += takes
        return takes

    for block_name in select_modules(model, default_unit_patterns(model), "float8"):
        block = model.get_submodule(block_name)
        for name, module in list(block.named_modules()):
            if isinstance(module, Conv1D) and fits(module):
                parent, _, child = name.rpartition(".")
                setattr(block.get_submodule(parent), child, Float8Conv1D(module, config))
        # torchao's own swap for nn.Linear; it also patches Inductor around a Triton miscompile
        # of float8 stores (torchao/float8/_inductor_patch.py).
        convert_to_float8_training(block, module_filter_fn=fits, config=config)
    if not swapped:
        raise ConfigurationError(
            "float8: no linear layer of this model's transformer blocks has sizes that are "
            "multiples of 16, as float8's kernels need; remove float8"
        )
    return swapped


def warn_if_uncompiled(model: torch.nn.Module) -> None:
    """Warn where float8 trains a model with no compiled module: its scaling and casts then run
    as eager kernels of their own, and no CUDA graph replays the step."""
    if not has_compiled_module(model):
        logger.warning(
            "float8 without compile is slow (on one H100, GPT-2 124M on PIQA batches of 16: "
            "138.5 ms a step against bf16's 38.7 ms); set compile: true (the sharded engines' "
            "sharding.compile, ddp's compile)"
        )
