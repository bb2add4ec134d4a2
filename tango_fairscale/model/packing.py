"""Whether a model takes packed batches, and what a packed row's tokens may attend: the attention
implementations and windows that allow it, the probe that checks it at load, the row's mask."""

from __future__ import annotations

from typing import Any

import torch

from ..data.batches import collate, packed_batch
from ..data.queries import Query
from ..runtime.devices import move_batch

#: Attention implementations that take the explicit (R, 1, T, T) masks of packed batches.
MASKED_ATTENTION = ("sdpa", "eager")


def attention_window(config: Any) -> int | None:
    """The shortest window of past tokens a layer of the model attends (sliding-window or local
    attention in some or all layers), or ``None`` when every layer sees every earlier token."""
    config = config.get_text_config()
    layer_types = getattr(config, "layer_types", None)
    windows = []
    if layer_types is not None:
        if any(kind != "full_attention" for kind in layer_types):
            windows += [getattr(config, "sliding_window", None)]
            windows += [getattr(config, "attention_chunk_size", None)]
    else:
        windows += [getattr(config, "sliding_window", None)]
    if "local" in (getattr(config, "attention_layers", None) or ()):  # GPT-Neo
        windows += [getattr(config, "window_size", None)]
    windows += [getattr(config, "attention_window_size", None)]  # RecurrentGemma
    known = [int(w) for w in windows if isinstance(w, int) and not isinstance(w, bool)]
    return min(known) if known else None


#: The packing probe: a shared context with two continuations, and another query.
_PROBE_QUERIES = (
    Query((100, 101, 102, 103, 104, 105, 7, 8, 9), 3),
    Query((100, 101, 102, 103, 104, 105, 11, 12), 2),
    Query((5, 6, 7, 8), 2),
)


def packing_matches_padding(model: torch.nn.Module, pad_token_id: int) -> bool:
    """Whether ``model`` (a :class:`~.causal_lm.ModelWrapper`) scores the probe queries packed as
    it scores them right-padded (to 1e-4), without error; in evaluation mode, on the model's
    device, without gradients (every module's mode is restored after)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            padded = model(**move_batch(collate(_PROBE_QUERIES, pad_token_id), device))
            packed = model(**move_batch(packed_batch(_PROBE_QUERIES, pad_token_id), device))
    except (ValueError, RuntimeError, TypeError, IndexError):  # Bloom: "too many values to unpack"
        return False
    finally:
        for module, training in modes:
            module.training = training
    return bool(
        torch.allclose(
            packed["loglikelihood"].double().cpu(),
            padded["loglikelihood"].double().cpu(),
            rtol=1e-4,
            atol=1e-4,
        )
    )


def packed_attention_mask(position_ids: torch.Tensor, query_ids: torch.Tensor) -> torch.Tensor:
    """``(R, 1, T, T)``, true where a token of a packed row may attend another (see
    :func:`~tango_fairscale.data.batches.packed_batch`): an earlier or the same token of its
    segment (a segment starts where the position is 0), shared (query -1) or of its own query."""
    segment = (position_ids == 0).cumsum(dim=1)
    same_segment = segment[:, :, None] == segment[:, None, :]
    visible = (query_ids[:, None, :] == -1) | (query_ids[:, :, None] == query_ids[:, None, :])
    width = position_ids.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=position_ids.device).tril()
    return (same_segment & visible & causal)[:, None]
