"""GPT-2's layout (``GPT2LMHeadModel``): learned positions added to the token embeddings, causal
attention in every block, ``ln_f``, and an LM head tied to ``wte``."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .family import Family, Modules


def _embed(modules: Modules, ids: Tensor, positions: Tensor) -> Tensor:
    # GPT2Model.forward without cache or token types.
    return modules["drop"](modules["wte"](ids) + modules["wpe"](positions))


def _refuse(model: Any, decoder: Any) -> str | None:
    if getattr(model.config, "add_cross_attention", False):
        return "its blocks have cross-attention (add_cross_attention), which needs encoder states"
    return None


FAMILIES = {
    "gpt2": Family(
        decoder="transformer",
        embeddings=("wte", "wpe", "drop"),
        layers="h",
        final=("ln_f",),
        embed=_embed,
        refuse=_refuse,
    )
}
