"""Loading a Hugging Face causal LM and its tokenizer from the hub, a directory or a config, with
one-line errors for what cannot be loaded."""

from __future__ import annotations

import difflib
import os
from typing import Any

import torch
from tango.common.exceptions import ConfigurationError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.activations import NewGELUActivation
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from ..checks import one_line


def fuse_tanh_gelu(model: torch.nn.Module) -> None:
    """Compute GPT-2's ``gelu_new`` with torch's fused kernel (the same tanh formula).

    Hugging Face's ``NewGELUActivation`` evaluates it as five elementwise kernels (measured: a
    third of the GPU time of PIQA scoring); ``nn.GELU(approximate="tanh")`` is one, and agrees to
    within float rounding (4.8e-7 in fp32). The saved config still says ``gelu_new``.
    """
    for name, module in list(model.named_modules()):
        if isinstance(module, NewGELUActivation):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, torch.nn.GELU(approximate="tanh"))


def build_model(model: str | None, config: dict[str, Any] | None, seed: int) -> PreTrainedModel:
    if config is None:
        assert model is not None
        try:
            return AutoModelForCausalLM.from_pretrained(model)
        except (OSError, ValueError) as error:
            raise ConfigurationError(_cannot_load("model", model, error)) from None
    config = dict(config)
    if model is not None:
        try:
            hf_config = AutoConfig.from_pretrained(model, **config)
        except (OSError, ValueError) as error:
            raise ConfigurationError(_cannot_load("model config", model, error)) from None
    else:
        model_type = config.pop("model_type", None)
        if model_type is None:
            raise ConfigurationError("'config' needs 'model_type' (e.g. \"gpt2\") without 'model'")
        if model_type not in CONFIG_MAPPING:
            close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ConfigurationError(f"unknown config.model_type {model_type!r}{hint}")
        hf_config = AutoConfig.for_model(model_type, **config)
    torch.manual_seed(seed)
    try:
        return AutoModelForCausalLM.from_config(hf_config)
    except (ValueError, TypeError) as error:  # e.g. n_embd not divisible by n_head
        reason = one_line(error, 300)
        raise ConfigurationError(f"cannot build a model from 'config': {reason}") from None


def load_tokenizer(source: str) -> Any:
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError) as error:
        raise ConfigurationError(_cannot_load("tokenizer", source, error)) from None


def set_padding_token(tokenizer: Any, config: Any) -> None:
    """GPT-2 style: pad with end-of-text (padding is masked out, so any real token serves).

    Tokenizer files without ``tokenizer_config.json`` name no special tokens: take the model
    config's ``eos_token_id`` then.
    """
    if tokenizer.pad_token_id is not None:
        return
    if tokenizer.eos_token_id is None:
        eos_id = getattr(config, "eos_token_id", None)
        if not isinstance(eos_id, int):
            raise ConfigurationError(
                "the tokenizer has no pad or end-of-text token and the model config no "
                "eos_token_id; add one of them to the model directory"
            )
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    tokenizer.pad_token = tokenizer.eos_token


def _cannot_load(what: str, source: str, error: Exception) -> str:
    if os.path.isdir(source):
        where = f"local directory {source!r}"
    elif source.startswith((".", "/", "~")) or os.sep in source.strip("/").split("/", 1)[-1]:
        where = f"path {source!r} (no such directory)"
    else:
        where = f"{source!r} (neither a local directory nor reachable on the Hugging Face hub)"
    reason = one_line(error, 300)
    return f"cannot load {what} from {where}: {reason}"
