"""The per-family contract: where a decoder keeps its parts and how its ``forward`` drives them.

A :class:`Family` names, inside a Hugging Face ``*ForCausalLM``, the decoder module, its embedding
modules, its list of layers and the modules applied after the last layer, and says what the
decoder's own ``forward`` computes between them: the embedding arithmetic, the attention kind of
each layer (each kind gets its own mask) and whether rotary position embeddings are computed once
for all layers or once per attention kind. Every decoder layer of transformers 5 is called the
same way, ``layer(hidden, attention_mask=..., position_ids=..., [position_embeddings=...])``, with
its cache arguments left at their defaults (no cache).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

FULL = "full_attention"
SLIDING = "sliding_attention"
#: ``Family.rotary``: no rotary embedding, one ``(cos, sin)`` for every layer, one per kind.
ROTARY_MODES = ("none", "shared", "per_kind")

#: A stage's embedding (or final) modules by name.
Modules = Mapping[str, nn.Module] | nn.ModuleDict
#: ``embed(modules, input_ids, positions) -> hidden``.
Embed = Callable[[Modules, torch.Tensor, torch.Tensor], torch.Tensor]


def full_attention(config: Any) -> list[str]:
    """Every layer attends causally to every earlier position."""
    return [FULL] * config.num_hidden_layers


def by_layer_types(config: Any) -> list[str]:
    """The kinds the config lists (``layer_types``: Qwen2/3, SmolLM3, Gemma 2/3)."""
    return list(config.layer_types[: config.num_hidden_layers])


def nothing_to_refuse(model: Any, decoder: Any) -> str | None:
    return None


@dataclass(frozen=True)
class Family:
    """One decoder layout (transformers 5).

    :param decoder: dotted attribute path from the ``*ForCausalLM`` to the decoder module.
    :param embeddings: the decoder's embedding modules, in the order ``embed`` uses them (a name
        whose attribute is ``None`` is left out, e.g. OPT's ``project_in``).
    :param layers: the decoder's ``ModuleList`` of layers.
    :param final: modules applied in order after the last layer (``None`` ones left out).
    :param embed: the decoder's embedding arithmetic, from its modules by name.
    :param kinds: the attention kind (``FULL`` / ``SLIDING``) of each layer.
    :param rotary: one of ``ROTARY_MODES``; the decoder's ``rotary_emb`` computes them.
    :param refuse: a one-line reason this model cannot be split, or ``None``.
    """

    decoder: str
    embeddings: tuple[str, ...]
    layers: str
    final: tuple[str, ...]
    embed: Embed
    kinds: Callable[[Any], list[str]] = full_attention
    rotary: str = "none"
    refuse: Callable[[Any, Any], str | None] = nothing_to_refuse

    def __post_init__(self) -> None:
        assert self.rotary in ROTARY_MODES, self.rotary

    def decoder_of(self, model: nn.Module) -> Any:
        """The decoder module (``AttributeError`` if the model is laid out otherwise)."""
        module: Any = model
        for name in self.decoder.split("."):
            module = getattr(module, name)
        return module

    def embedding_modules(self, decoder: Any) -> dict[str, nn.Module]:
        return _present(decoder, self.embeddings)

    def layer_list(self, decoder: Any) -> list[nn.Module]:
        return list(getattr(decoder, self.layers))

    def final_modules(self, decoder: Any) -> dict[str, nn.Module]:
        return _present(decoder, self.final)

    def rotary_of(self, decoder: Any) -> nn.Module | None:
        """The decoder's rotary embedding module, for families that use one."""
        return None if self.rotary == "none" else decoder.rotary_emb


def _present(decoder: Any, names: tuple[str, ...]) -> dict[str, nn.Module]:
    modules = {name: getattr(decoder, name) for name in names}
    return {name: module for name, module in modules.items() if module is not None}
