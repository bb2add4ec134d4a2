"""Precision settings by Lightning's names, resolved into the dtypes an engine computes and
updates in."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tango.common.exceptions import ConfigurationError

from ..checks import one_of

PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true")


@dataclass(frozen=True)
class Precision:
    """A resolved precision setting (Lightning's names)."""

    name: str
    compute_dtype: torch.dtype  # dtype of matrix multiplications
    param_dtype: torch.dtype  # dtype the optimizer updates

    @property
    def mixed(self) -> bool:
        return self.name.endswith("-mixed")

    @property
    def needs_grad_scaler(self) -> bool:
        return self.name == "16-mixed"


def resolve_precision(name: str, device: torch.device) -> Precision:
    """Turn a precision name into dtypes; ``auto`` is ``bf16-mixed`` on a bf16 GPU, else fp32."""
    one_of("precision", name, PRECISIONS)
    if name == "auto":
        on_bf16_gpu = device.type == "cuda" and torch.cuda.is_bf16_supported()
        name = "bf16-mixed" if on_bf16_gpu else "32-true"
    if name == "16-mixed" and device.type != "cuda":
        raise ConfigurationError(
            "precision '16-mixed' (fp16 with gradient scaling) needs a CUDA GPU; "
            "use 'bf16-mixed' or '32-true' on CPU"
        )
    return {
        "32-true": Precision(name, torch.float32, torch.float32),
        "bf16-mixed": Precision(name, torch.bfloat16, torch.float32),
        "16-mixed": Precision(name, torch.float16, torch.float32),
        "bf16-true": Precision(name, torch.bfloat16, torch.bfloat16),
    }[name]
