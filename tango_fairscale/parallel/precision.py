"""Precision, apart from how an engine wraps the model (Lightning's precision plugin): settings by
Lightning's names resolved into the dtypes an engine computes and updates in, the model converted
and forwards autocast to them (:class:`Precision`), and fp16's loss scaling around backward and the
optimizer step (:class:`LossScaling`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tango.common.exceptions import ConfigurationError
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..checks import one_of
from . import PRECISIONS

logger = logging.getLogger(__name__)

#: The attention kernels a forward may take on a GPU: every one but cuDNN's, which builds an
#: execution plan for each new shape — 0.15-1.2 s each on an H200 (torch 2.11), where the
#: memory-efficient kernel starts in milliseconds and runs a step as fast — and packed scoring
#: and training batches change shape from batch to batch.
GPU_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


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

    def convert_module(self, module: torch.nn.Module) -> Any:
        """``module`` in the dtype the optimizer updates, whatever its checkpoint stored (a bf16
        checkpoint trains on fp32 master weights under ``32-true`` and the ``-mixed`` ones)."""
        return module.to(self.param_dtype)

    @contextlib.contextmanager
    def forward_context(self, device: torch.device, cache_weights: bool = True) -> Iterator[None]:
        """Where forwards run: autocast to :attr:`compute_dtype` under the ``-mixed`` ones, and
        :meth:`attention_kernels`; ``cache_weights=False`` for a pass captured in a CUDA graph,
        which must cast the weights it is replayed with (autocast's cache would keep the
        capture's casts)."""
        autocast = torch.autocast(
            device.type, dtype=self.compute_dtype, enabled=self.mixed, cache_enabled=cache_weights
        )
        with autocast, self.attention_kernels(device):
            yield

    def attention_kernels(self, device: torch.device) -> contextlib.AbstractContextManager:
        """Where forwards and backwards run: on a GPU, the attention kernels of
        :data:`GPU_ATTENTION`. Backwards too, so that activation checkpointing recomputes a
        forward with the kernels that ran it (torch's checkpoint refuses a recomputation that
        saves other tensors: cuDNN's attention, allowed outside, saved a (1, 1, T, T) mask where
        the efficient kernel had saved a (1, H, T, T) one, bf16 on an H100)."""
        return sdpa_kernel(GPU_ATTENTION) if device.type == "cuda" else contextlib.nullcontext()


def auto_precision_key() -> str:
    """Precision ``auto`` as a cache key holds it: with the kind of device it resolves for on
    this machine (``auto/cuda``: bf16-mixed on a bf16 GPU; ``auto/cpu``: 32-true), so that a
    result computed in one precision is not served where ``auto`` means the other; told without
    starting CUDA."""
    return f"auto/{'cuda' if torch.cuda.is_available() else 'cpu'}"


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


class LossScaling:
    """fp16's loss scaling (``16-mixed``): the loss scaled before backward, the gradients unscaled
    before clipping, a step with an overflowed gradient skipped (counted and logged) and the scale
    lowered. Without a ``grad_scaler`` (every other precision) it only runs backward, clips and
    steps. ``grad_scaler``: torch's, or a sharded engine's own (FairScale's, FSDP2's)."""

    def __init__(self, grad_scaler: Any | None) -> None:
        self.grad_scaler = grad_scaler
        self.skipped_steps = 0

    def backward(self, loss: torch.Tensor) -> None:
        if self.grad_scaler is not None:
            loss = self.grad_scaler.scale(loss)
        loss.backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, clip: Callable[[], Any]) -> None:
        """``clip`` the (unscaled) gradients, then step ``optimizer`` unless one overflowed."""
        scaler = self.grad_scaler
        if scaler is None:
            clip()
            optimizer.step()
            return
        scale = scaler.get_scale()
        scaler.unscale_(optimizer)
        clip()
        scaler.step(optimizer)  # skipped when a gradient overflowed
        scaler.update()
        if scaler.get_scale() < scale:
            self.skipped_steps += 1
            logger.warning(
                "fp16 gradient overflow: optimizer step skipped, loss scale %g -> %g",
                scale,
                scaler.get_scale(),
            )
