"""The Llama family's layout: ``embed_tokens``, rotary position embeddings computed once per
forward and handed to every layer, one mask per attention kind, a final RMS ``norm``.

Model types: ``llama`` (also SmolLM and SmolLM2), ``mistral`` (one kind for all layers: sliding
when ``sliding_window`` is set), ``qwen2`` / ``qwen3`` / ``smollm3`` (kinds from ``layer_types``;
SmolLM3's no-RoPE layers decide that inside the layer), ``gemma`` and ``gemma2`` / ``gemma3_text``
(kinds from ``layer_types``; Gemma 3 computes rotary embeddings per kind, with its local base
frequency for sliding layers). Gemma's ``sqrt(hidden_size)`` embedding scale lives inside its
``*ScaledWordEmbedding`` in transformers 5, so ``embed_tokens(ids)`` serves every model type.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .family import FULL, SLIDING, Family, Modules, by_layer_types, full_attention


def _embed(modules: Modules, ids: Tensor, positions: Tensor) -> Tensor:
    return modules["embed_tokens"](ids)


def _mistral_kinds(config: Any) -> list[str]:
    # MistralModel.forward: a sliding-window mask for every layer iff sliding_window is set.
    kind = FULL if config.sliding_window is None else SLIDING
    return [kind] * config.num_hidden_layers


def _refuse_gemma(model: Any, decoder: Any) -> str | None:
    config = model.config
    if not hasattr(decoder.embed_tokens, "embed_scale"):
        return "its embedding has no embed_scale (a transformers version that scales elsewhere)"
    if getattr(config, "use_bidirectional_attention", False):
        return "it uses bidirectional attention (use_bidirectional_attention), not causal"
    return None


def _family(kinds: Any = full_attention, rotary: str = "shared", refuse: Any = None) -> Family:
    extra = {} if refuse is None else {"refuse": refuse}
    return Family(
        decoder="model",
        embeddings=("embed_tokens",),
        layers="layers",
        final=("norm",),
        embed=_embed,
        kinds=kinds,
        rotary=rotary,
        **extra,
    )


FAMILIES = {
    "llama": _family(),
    "mistral": _family(_mistral_kinds),
    "qwen2": _family(by_layer_types),
    "qwen3": _family(by_layer_types),
    "smollm3": _family(by_layer_types),
    "gemma": _family(refuse=_refuse_gemma),
    "gemma2": _family(by_layer_types, refuse=_refuse_gemma),
    "gemma3_text": _family(by_layer_types, rotary="per_kind", refuse=_refuse_gemma),
}
