"""Pipeline stages of a Hugging Face decoder-only causal LM, for FairScale's ``Pipe``.

:func:`build_stages` cuts a ``*ForCausalLM`` into an ``nn.Sequential`` of :class:`Stage` s, one per
pipeline partition, from the model's own modules (so its ``state_dict`` keeps the Hugging Face
key names):

    embeddings + layers [0, a) | layers [a, b) | ... | layers [y, n) + final norm + LM head + loss

The last stage returns ``(row_mean_nll, row_nll, num_tokens)`` per row, as
:func:`~tango_fairscale.model.loss.scored_row_nll` does for ``ModelWrapper.forward``.
Each supported ``model_type`` has a :class:`~.family.Family` entry (``gpt2.py``, ``llama.py``,
``gpt_neox.py``, ``opt.py``); any other model is refused in one line. An LM head tied to the
input embedding computes with a :class:`TiedWeight` mirror on the last stage's device: its
gradient is added to the embedding's before each optimizer step and the mirror is refreshed after
it, so the optimizer and the state dict only ever see the one real parameter.
"""

from .build import (
    FAMILIES,
    SUPPORTED,
    Stages,
    auto_balance,
    build_stages,
    family_of,
    num_layers,
    partition,
)
from .stage import Projection, Stage, StagePrecision, StageSettings, TiedWeight

__all__ = [
    "FAMILIES",
    "SUPPORTED",
    "Projection",
    "Stage",
    "StagePrecision",
    "StageSettings",
    "Stages",
    "TiedWeight",
    "auto_balance",
    "build_stages",
    "family_of",
    "num_layers",
    "partition",
]
