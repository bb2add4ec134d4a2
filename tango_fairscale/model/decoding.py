"""Decoding with a key/value cache: the next-token logits of a causal LM as Hugging Face's
``generate`` computes them, and what a model's generation config may set for them to be exact.

:meth:`~tango_fairscale.model.causal_lm.ModelWrapper.forward` runs :func:`next_token_logits` when
given ``past_key_values``, so that decoding goes through an engine's wrapped model (FSDP's
forward gathers the parameters) like scoring does.
"""

from __future__ import annotations

from typing import Any

import torch
from tango.common.exceptions import ConfigurationError

from .. import compat  # noqa: F401  (the fixes; transformers' before it is imported)

#: Generation-config fields that add a logits processor to greedy decoding in ``generate``,
#: with the value at which they add none. The package's decoding applies none of them.
GREEDY_NEUTRAL = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "min_length": 0,
    "min_new_tokens": 0,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": 1.0,
    "renormalize_logits": False,
}


def new_cache(model: Any, max_cache_len: int | None = None) -> Any:
    """An empty key/value cache for the Hugging Face model ``model``: preallocated for
    ``max_cache_len`` tokens (written in place: no copy of the cache per token) where the model
    takes a static cache and every layer attends all earlier tokens, else one that grows (its
    sliding or hybrid layers as its config says)."""
    from transformers import DynamicCache, StaticCache

    if max_cache_len is not None and takes_static_cache(model):
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    return DynamicCache(config=model.config)


def takes_static_cache(model: Any) -> bool:
    """Whether ``model`` decodes with a preallocated cache: ``generate`` compiles it with one,
    and no layer attends a window or keeps a recurrent state."""
    config = model.config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    full = all(kind == "full_attention" for kind in layer_types)
    windowed = getattr(config, "sliding_window", None) is not None
    return bool(getattr(model, "_can_compile_fullgraph", False)) and full and not windowed


#: Attention implementations that take the explicit (B, 1, Q, K) masks built here.
EXPLICIT_MASKS = ("sdpa", "eager")


def explicit_mask(padding: torch.Tensor, queries: int, cached: int, implementation: str) -> Any:
    """The ``(B, 1, queries, K)`` mask of ``queries`` new tokens after ``cached`` tokens over a
    preallocated cache of ``K`` slots: a slot is seen where ``padding`` (``(B, K)``, 0 on
    padding) has it and it is not after the query's own slot. Given to the model instead of
    ``padding``, it spares transformers' own mask building, which reads the device on the host
    once per forward (whether the mask can be left out)."""
    slots = torch.arange(padding.shape[1], device=padding.device)
    own = torch.arange(cached, cached + queries, device=padding.device)
    mask = (padding.bool()[:, None, :] & (slots[None, :] <= own[:, None])[None])[:, None]
    if implementation == "eager":  # an additive mask there
        return torch.zeros(mask.shape, device=mask.device).masked_fill_(
            ~mask, torch.finfo(torch.float32).min
        )
    return mask


def cache_bytes_per_token(model: Any, value_bytes: int) -> int:
    """The bytes one token's keys and values take in the cache of every layer of ``model``."""
    config = model.config.get_text_config()

    def field(*names: str) -> int:
        return next((int(v) for n in names if (v := getattr(config, n, None)) is not None), 0)

    heads = field("num_attention_heads", "n_head") or 1
    head_dim = field("head_dim") or field("hidden_size", "n_embd") // heads
    layers, kv_heads = field("num_hidden_layers", "n_layer"), field("num_key_value_heads") or heads
    return layers * 2 * kv_heads * head_dim * value_bytes


def keep_rows(cache: Any, index: torch.Tensor) -> None:
    """Keep only the rows ``index`` of ``cache``, in place (its beam-search reordering, which
    selects rows of every layer)."""
    cache.reorder_cache(index)
    for layer in cache.layers:
        if hasattr(layer, "batch_size"):
            layer.batch_size = len(index)


def next_token_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Any,
) -> dict[str, torch.Tensor]:
    """``{"logits": (B, V) float32}``: the model's own logits (its transforms included) at the
    last position of each row of ``input_ids``, which follow the tokens held by ``cache``
    (updated in place); ``attention_mask`` covers the cached and the new tokens, 0 on padding."""
    kwargs: dict[str, Any] = {}
    if "logits_to_keep" in _forward_parameters(model):
        kwargs["logits_to_keep"] = 1
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        **kwargs,
    )
    return {"logits": outputs.logits[:, -1].float()}


def _forward_parameters(model: Any) -> Any:
    import inspect

    parameters = getattr(model, "_tango_fairscale_forward_parameters", None)
    if parameters is None:
        parameters = set(inspect.signature(model.forward).parameters)
        model._tango_fairscale_forward_parameters = parameters
    return parameters


def eos_token_ids(model: Any) -> set[int]:
    """The token ids that end a sequence in ``generate``: the generation config's
    ``eos_token_id`` (an id or a list), none when it has none."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(token) for token in (eos if isinstance(eos, (list, tuple)) else [eos])}


def check_generation_config(model: Any, name: str) -> None:
    """Refuse, in one line, a model whose generation config changes greedy decoding in ways the
    package does not reproduce (a repetition penalty, banned or forced tokens, ...)."""
    config = model.generation_config
    for field, neutral in GREEDY_NEUTRAL.items():
        value = getattr(config, field, neutral)
        if value is not None and value != neutral:
            raise ConfigurationError(
                f"model {name!r}: its generation_config sets {field}={value!r}, which the "
                f"package's decoding does not apply; set it to {neutral!r} in "
                "generation_config.json to generate"
            )
