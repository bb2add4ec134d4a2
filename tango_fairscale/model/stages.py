"""A Hugging Face GPT-2 turned into a flat sequence of pipeline layers.

FairScale's ``Pipe`` runs an ``nn.Sequential`` whose layers pass a tensor or a tuple of tensors
along. :func:`gpt2_layers` builds that sequence from the modules of a
:class:`~tango_fairscale.model.causal_lm.ModelWrapper` (the modules themselves, not copies, so
the wrapper's ``state_dict`` stays the model's, under its original key names):

    Embeddings (wte, wpe, dropout) | Block 0 | ... | Block n-1 | Head (ln_f, LM head, token NLL)

Every layer takes and returns ``(hidden, attention_mask, targets)``, except the first, which takes
``(input_ids, attention_mask, targets)``, and the last, which returns ``(row_mean_nll, row_nll,
num_tokens)`` per row: the batch dimension survives to the end, so ``Pipe`` can cut a batch into
micro-batches and concatenate the outputs. The loss is computed from those rows outside the pipe,
exactly as ``ModelWrapper.forward`` computes it.

GPT-2 ties the LM head to the token embedding. The two ends of the pipe can be on different
devices, so the head uses a :class:`TiedWeight` mirror on the last stage's device: its gradient
is added to the embedding's before each optimizer step, and the updated embedding is copied back
after it. The optimizer and the state dict only ever see the one real parameter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tango.common.exceptions import ConfigurationError
from torch import nn
from transformers import PreTrainedConfig
from transformers.masking_utils import create_causal_mask

from .causal_lm import ModelWrapper
from .loss import scored_row_nll

SUPPORTED = "GPT-2 (GPT2LMHeadModel, model_type 'gpt2', without cross-attention)"

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class StagePrecision:
    """Autocast settings applied inside every layer.

    ``Pipe`` computes in worker threads, and autocast is thread-local: an autocast around the
    pipe would not reach the layers.
    """

    dtype: torch.dtype = torch.float32
    enabled: bool = False

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)


class TiedWeight:
    """A copy of a tied parameter on another device (the LM head's view of the embedding).

    The copy is a leaf tensor requiring grad, deliberately not a registered parameter: the
    optimizer, gradient clipping and the state dict see only ``source``.
    """

    def __init__(self, source: nn.Parameter, device: torch.device) -> None:
        self.source = source
        self.mirror = source.detach().to(device, copy=True).requires_grad_(source.requires_grad)

    def merge_grads(self) -> None:
        """Add the mirror's gradient to the source's (call after backward, before the step)."""
        grad = self.mirror.grad
        if grad is None:
            return
        grad = grad.to(self.source.device)
        if self.source.grad is None:
            self.source.grad = grad.clone()
        else:
            self.source.grad.add_(grad)
        self.mirror.grad = None

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the source's values into the mirror (call after the step or a load)."""
        self.mirror.copy_(self.source)


class _Projection(nn.Module):
    """A bias-free linear layer over a weight it does not own (so ``.to`` never moves it)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight  # a plain attribute, not a parameter

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


def _positions(hidden: torch.Tensor) -> torch.Tensor:
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


class Embeddings(nn.Module):
    """``(input_ids, attention_mask, targets)`` → ``(hidden, attention_mask, targets)``."""

    def __init__(self, transformer: Any, precision: StagePrecision) -> None:
        super().__init__()
        self.wte: nn.Module = transformer.wte
        self.wpe: nn.Module = transformer.wpe
        self.drop: nn.Module = transformer.drop
        self.precision = precision

    def forward(self, inputs: Tensors) -> Tensors:
        input_ids, attention_mask, targets = inputs
        with self.precision.autocast(input_ids.device):
            embeds = self.wte(input_ids)  # as GPT2Model.forward, with no cache
            hidden = self.drop(embeds + self.wpe(_positions(embeds)))
        return hidden, attention_mask, targets


class Block(nn.Module):
    """One transformer block; the causal mask is rebuilt from the 2-D mask as GPT2Model does."""

    def __init__(
        self, block: nn.Module, config: PreTrainedConfig, precision: StagePrecision
    ) -> None:
        super().__init__()
        self.block = block
        self.config = config
        self.precision = precision

    def forward(self, inputs: Tensors) -> Tensors:
        hidden, attention_mask, targets = inputs
        positions = _positions(hidden)
        with self.precision.autocast(hidden.device):
            causal_mask = create_causal_mask(
                config=self.config,
                inputs_embeds=hidden,
                attention_mask=attention_mask,
                past_key_values=None,
                position_ids=positions,
            )
            hidden = self.block(
                hidden,
                None,
                causal_mask,
                None,
                encoder_attention_mask=None,
                use_cache=False,
                position_ids=positions,
            )
        return hidden, attention_mask, targets


class Head(nn.Module):
    """``(hidden, attention_mask, targets)`` → ``(row_mean_nll, row_nll, num_tokens)``: final
    norm, the vocabulary projection at scored positions only, and each row's cross-entropy
    (:func:`~tango_fairscale.model.loss.scored_row_nll`)."""

    def __init__(self, ln_f: nn.Module, projection: nn.Module, precision: StagePrecision) -> None:
        super().__init__()
        self.ln_f = ln_f
        self.projection = projection
        self.precision = precision

    def forward(self, inputs: Tensors) -> Tensors:
        hidden, _, targets = inputs
        with self.precision.autocast(hidden.device):
            return scored_row_nll(self.projection, self.ln_f(hidden), targets)


# --- turning the model into layers ---------------------------------------------------------------


def check_gpt2(wrapper: ModelWrapper) -> None:
    """Refuse models whose layout the pipe engine does not know."""
    model = wrapper.model
    config = model.config
    transformer = getattr(model, "transformer", None)
    known = (
        getattr(config, "model_type", None) == "gpt2"
        and transformer is not None
        and all(hasattr(transformer, name) for name in ("wte", "wpe", "drop", "h", "ln_f"))
        and model.get_output_embeddings() is not None
        and not getattr(config, "add_cross_attention", False)
    )
    if not known:
        raise ConfigurationError(
            f"the pipe engine cannot split {type(model).__name__} (model_type "
            f"{getattr(config, 'model_type', None)!r}) into stages; supported: {SUPPORTED}; "
            "use engine ddp, fairscale or fsdp2 for other models"
        )


def num_blocks(wrapper: ModelWrapper) -> int:
    check_gpt2(wrapper)
    return len(_hf(wrapper).transformer.h)


def _hf(wrapper: ModelWrapper) -> Any:
    """The Hugging Face model, untyped (its submodules are attributes torch cannot type)."""
    return wrapper.model


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def auto_balance(wrapper: ModelWrapper, stages: int) -> list[int]:
    """Blocks per stage, contiguous, at least one each, minimising the largest stage's parameter
    count (the embeddings count on the first stage, final norm and LM head on the last)."""
    model = _hf(wrapper)
    transformer = model.transformer
    sizes = [_numel(block) for block in transformer.h]
    head = model.get_output_embeddings()
    first = _numel(transformer.wte) + _numel(transformer.wpe)
    last = _numel(transformer.ln_f) + _numel(head)  # a tied head is mirrored: it costs memory too
    return partition(sizes, stages, first, last)


def partition(sizes: Sequence[int], stages: int, first: int = 0, last: int = 0) -> list[int]:
    """Cut ``sizes`` into ``stages`` contiguous non-empty parts minimising the largest part
    (``first`` / ``last`` are added to the first / last part). Dynamic programming, exact."""
    n = len(sizes)
    stages = max(1, min(stages, n))
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)

    def cost(start: int, end: int, stage: int) -> int:
        extra = (first if stage == 0 else 0) + (last if stage == stages - 1 else 0)
        return prefix[end] - prefix[start] + extra

    infinity = float("inf")
    # best[k][i]: the smallest largest-part for the first i sizes in k parts; cut[k][i]: the
    # start of the k-th part.
    best = [[infinity] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], cost(j, i, k - 1))
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    balance: list[int] = []
    end = n
    for k in range(stages, 0, -1):
        start = cut[k][end]
        balance.append(end - start)
        end = start
    return balance[::-1]


@dataclass
class Layers:
    """The layers for ``Pipe``, its balance in layers, and the tied weight to keep in step."""

    layers: nn.Sequential
    balance: list[int]
    tied: TiedWeight | None


def gpt2_layers(
    wrapper: ModelWrapper,
    balance: Sequence[int],
    last_device: torch.device,
    precision: StagePrecision,
) -> Layers:
    """The model as Embeddings, blocks and Head; ``balance`` counts blocks per stage (the
    embeddings join the first stage, the head the last)."""
    check_gpt2(wrapper)
    model = _hf(wrapper)
    transformer = model.transformer
    head = model.get_output_embeddings()
    tied: TiedWeight | None = None
    projection: nn.Module = head
    if head.weight is transformer.wte.weight:
        tied = TiedWeight(transformer.wte.weight, last_device)
        projection = _Projection(tied.mirror)
    elif getattr(head, "bias", None) is not None:
        raise ConfigurationError(f"the pipe engine supports {SUPPORTED} (an LM head without bias)")
    layers = nn.Sequential(
        Embeddings(transformer, precision),
        *(Block(block, model.config, precision) for block in transformer.h),
        Head(transformer.ln_f, projection, precision),
    )
    layer_balance = list(balance)
    layer_balance[0] += 1
    layer_balance[-1] += 1
    _check_covered(wrapper, layers, tied)
    return Layers(layers, layer_balance, tied)


def _check_covered(wrapper: ModelWrapper, layers: nn.Module, tied: TiedWeight | None) -> None:
    """Every parameter of the model must be in some layer (else the model is not GPT-2-like)."""
    placed = {id(p) for p in layers.parameters()}
    missing = [
        name
        for name, p in wrapper.named_parameters()
        if id(p) not in placed and not (tied is not None and p is tied.source)
    ]
    if missing:
        raise ConfigurationError(
            f"the pipe engine supports {SUPPORTED}; this model has parameters outside its "
            f"stages: {', '.join(missing[:4])}"
        )
