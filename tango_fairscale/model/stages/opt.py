"""OPT's layout (``OPTForCausalLM``): token embeddings, an optional ``project_in``, learned
positions (the module adds OPT's offset of 2 itself), causal attention, an optional
``final_layer_norm`` and ``project_out``, and an LM head tied to the token embeddings."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .family import Family, Modules


def _embed(modules: Modules, ids: Tensor, positions: Tensor) -> Tensor:
    # OPTDecoder.forward without a padding mask (it then takes one of ones, whose positions
    # cumsum(mask) - 1 are these), as ModelWrapper calls it.
    hidden = modules["embed_tokens"](ids)
    if "project_in" in modules:
        hidden = modules["project_in"](hidden)
    return hidden + modules["embed_positions"](None, 0, position_ids=positions)


def _refuse(model: Any, decoder: Any) -> str | None:
    if model.config.layerdrop:
        return (
            f"layerdrop={model.config.layerdrop} skips layers at random in training, which a "
            "pipeline's fixed stages cannot; set layerdrop to 0"
        )
    return None


FAMILIES = {
    "opt": Family(
        decoder="model.decoder",
        embeddings=("embed_tokens", "project_in", "embed_positions"),
        layers="layers",
        final=("final_layer_norm", "project_out"),
        embed=_embed,
        refuse=_refuse,
    )
}
