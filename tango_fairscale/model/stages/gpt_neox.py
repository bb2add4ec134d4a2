"""GPT-NeoX's layout (``GPTNeoXForCausalLM``, e.g. Pythia): ``embed_in`` and ``emb_dropout``, one
rotary embedding for every layer (partial rotary, ``rotary_pct``, is applied inside attention),
``final_layer_norm``, and an LM head that is untied by default (``embed_out`` before
transformers 5)."""

from __future__ import annotations

from torch import Tensor

from .family import Family, Modules


def _embed(modules: Modules, ids: Tensor, positions: Tensor) -> Tensor:
    return modules["emb_dropout"](modules["embed_in"](ids))


FAMILIES = {
    "gpt_neox": Family(
        decoder="gpt_neox",
        embeddings=("embed_in", "emb_dropout"),
        layers="layers",
        final=("final_layer_norm",),
        embed=_embed,
        rotary="shared",
    )
}
