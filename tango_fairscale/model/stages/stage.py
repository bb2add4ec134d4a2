"""One pipeline stage: a contiguous run of a decoder's layers, with the embeddings on the first
stage and the final modules, LM head and loss on the last.

A stage takes ``(input_ids, targets)`` (the first) or ``(hidden, targets)`` and returns
``(hidden, targets)``, or from the last :func:`~tango_fairscale.model.loss.scored_row_nll`'s
``(row_mean_nll, row_nll, num_tokens[, row_greedy])``. Only these
batch-first tensors cross stages: FairScale's ``Pipe`` chunks every tensor of the tuple along
dimension 0 and zips the chunks, so a tensor with a first dimension of 1 (``position_ids``, rotary
``cos``/``sin``) would silently cut every batch into one micro-batch. Each stage therefore rebuilds
what the decoder's ``forward`` computes once, from the hidden states it receives: positions
``0..T-1``, its own copy of the rotary embedding (buffers only, none persistent: no state-dict
keys, and on the stage's device), and one mask per attention kind of its layers.

As :class:`~tango_fairscale.model.causal_lm.ModelWrapper` does for right-padded rows, no padding
mask is used: the causal mask alone keeps every real token from seeing padding, which only
follows it, and attention keeps SDPA's causal kernel.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ... import compat  # noqa: F401  (the fixes; transformers' before it is imported)
from ..loss import IDENTITY, LogitTransform, scored_row_nll
from .family import FULL, SLIDING, Family

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class StagePrecision:
    """Autocast settings applied inside every stage.

    ``Pipe`` computes in worker threads, and autocast is thread-local: an autocast around the
    pipe would not reach the stages.
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


class Projection(nn.Module):
    """A bias-free linear layer over a weight it does not own (so ``.to`` never moves it)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight  # a plain attribute, not a parameter

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


#: The mask function of each attention kind (as the decoders' own forwards call them), by its name
#: in transformers' ``masking_utils``: looked up when a stage runs, since that module costs ~1 s to
#: import and a ``tango run`` that builds no pipe does not need it.
MASKS = {FULL: "create_causal_mask", SLIDING: "create_sliding_window_causal_mask"}


@dataclass(frozen=True, eq=False)
class StageSettings:
    """What every stage of one decoder shares.

    :param family: the decoder's family (its embeddings, layers, rotary and final modules).
    :param config: the model's config (for its attention masks).
    :param rotary: the decoder's ``rotary_emb`` (each stage with layers copies it), for families
        with rotary embeddings.
    :param transform: what the model's own forward does to the head's output (soft cap, scale).
    :param precision: the autocast applied inside the stage.
    """

    family: Family
    config: Any
    rotary: nn.Module | None = None
    transform: LogitTransform = IDENTITY
    precision: StagePrecision = StagePrecision()


class Stage(nn.Module):
    """Layers ``layers`` of the decoder (the model's own modules, not copies), preceded by the
    ``embeddings`` on the first stage and followed by ``final`` and ``head`` on the last.

    :param settings: what every stage of the decoder shares (:class:`StageSettings`).
    :param kinds: the attention kind of each of ``layers``.
    :param head: the vocabulary projection (the LM head, or a :class:`Projection` of a tied
        embedding's mirror); given exactly for the last stage.
    """

    def __init__(
        self,
        settings: StageSettings,
        layers: Sequence[nn.Module],
        kinds: Sequence[str],
        *,
        embeddings: Mapping[str, nn.Module] | None = None,
        final: Mapping[str, nn.Module] | None = None,
        head: nn.Module | None = None,
    ) -> None:
        super().__init__()
        assert len(layers) == len(kinds)
        self.family = settings.family
        self.config = settings.config
        self.first = embeddings is not None
        self.embeddings = nn.ModuleDict(embeddings or {})
        self.layers = nn.ModuleList(layers)
        self.kinds = list(kinds)
        # A copy per stage: the model's one rotary module cannot live on several devices.
        rotary = settings.rotary
        self.rotary = copy.deepcopy(rotary) if rotary is not None and layers else None
        self.final = nn.ModuleDict(final or {})
        self.head = head
        self.transform = settings.transform
        self.precision = settings.precision

    def forward(self, inputs: Tensors) -> Tensors:
        first_input, targets = inputs
        device = first_input.device
        positions = torch.arange(first_input.shape[1], device=device).unsqueeze(0)
        with self.precision.autocast(device):
            hidden = first_input
            if self.first:
                hidden = self.family.embed(self.embeddings, first_input, positions)
            hidden = self._run_layers(hidden, positions)
            if self.head is None:
                return hidden, targets
            for module in self.final.values():
                hidden = module(hidden)
            outputs = scored_row_nll(self.head, hidden, targets, transform=self.transform)
        # Pipe runs a checkpointed micro-batch's forward without gradients (scored_row_nll's
        # scoring path, which adds row_greedy) and recomputes it with them: in training, both
        # return (row_mean_nll, row_nll, num_tokens).
        return outputs[:3] if self.training else outputs

    def _run_layers(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not self.layers:
            return hidden
        from transformers import masking_utils

        # position_ids are not passed: with no padding mask either, transformers would read
        # them on the host to look for packed rows, and these rows are never packed.
        masks = {
            kind: getattr(masking_utils, MASKS[kind])(
                config=self.config, inputs_embeds=hidden, attention_mask=None, past_key_values=None
            )
            for kind in set(self.kinds)
        }
        rotary: dict[str, Any] = {}
        if self.rotary is not None and self.family.rotary == "shared":
            shared = self.rotary(hidden, positions)
            rotary = {kind: shared for kind in masks}
        elif self.rotary is not None:
            rotary = {kind: self.rotary(hidden, positions, kind) for kind in masks}
        for layer, kind in zip(self.layers, self.kinds):
            extra = {"position_embeddings": rotary[kind]} if rotary else {}
            hidden = layer(hidden, attention_mask=masks[kind], position_ids=positions, **extra)
        return hidden
