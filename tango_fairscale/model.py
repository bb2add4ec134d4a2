"""The Tango ``Model`` around a Hugging Face causal LM: loading, training loss, choice scoring."""

from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.activations import NewGELUActivation
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .batching import IGNORE_INDEX

logger = logging.getLogger(__name__)

#: Rows of logits computed at once (a 4096 × 50257 fp32 chunk is 0.8 GB).
LOGIT_CHUNK_ROWS = 4096


@Model.register("tango_fairscale::causal_lm")
class ModelWrapper(Model):
    """A Hugging Face causal LM with its tokenizer, scoring choices the way lm-eval does.

    Registered as a Tango ``Model`` under the name ``"tango_fairscale::causal_lm"``.

    :param model: a Hugging Face hub id or a local directory holding ``config.json`` and weights.
    :param config: build the model with random weights from this config instead of loading weights
        (merged over ``model``'s config when both are given; needs ``model_type`` otherwise).
    :param tokenizer: hub id or local directory of the tokenizer; defaults to ``model``.
    :param seed: seeds the random initialisation when ``config`` is given.

    ``forward(input_ids, attention_mask, labels)`` takes a right-padded batch from
    :func:`tango_fairscale.batching.collate` and returns

    * ``loglikelihood`` ``(B,)``: the summed log-probability of each row's labelled tokens;
    * ``num_tokens`` ``(B,)``: how many tokens each row scores;
    * ``loss``: the mean over rows of the per-token cross-entropy of each row — the same for any
      split of a batch into equal parts, so data-parallel ranks average to the global loss.

    Example (Jsonnet)::

        model: {type: "tango_fairscale::causal_lm", model: "gpt2"}
        model: {type: "tango_fairscale::causal_lm", tokenizer: "/data/gpt2-tokenizer",
                config: {model_type: "gpt2", n_layer: 2, n_embd: 64, n_head: 2}, seed: 1}
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        config: dict[str, Any] | None = None,
        tokenizer: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name, value in (("model", model), ("tokenizer", tokenizer)):
            if value is not None and not isinstance(value, str):
                raise ConfigurationError(
                    f"'{name}' must be a hub id or directory (a string), got {value!r}"
                )
        if config is not None and not isinstance(config, dict):
            raise ConfigurationError(
                f"'config' must be an object of Hugging Face config fields, got {config!r}"
            )
        if model is None and config is None:
            raise ConfigurationError("give the model a hub id or directory ('model') or a 'config'")
        tokenizer_source = tokenizer or model
        if tokenizer_source is None:
            raise ConfigurationError(
                "a model built from 'config' needs 'tokenizer' (hub id or dir)"
            )
        self.model: PreTrainedModel = _build_model(model, config, seed)
        _fuse_tanh_gelu(self.model)
        #: Logged training metrics by step (set by the training step and the stored format).
        self.training_log: list[dict[str, Any]] = []
        self.tokenizer = _load_tokenizer(tokenizer_source)
        _set_padding_token(self.tokenizer, self.model.config)

    @property
    def max_length(self) -> int:
        """The longest input the model accepts (its position embeddings)."""
        config = self.model.config
        for name in ("max_position_embeddings", "n_positions", "n_ctx"):
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return self.tokenizer.model_max_length

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        # Position t is predicted from positions < t: the last token is never an input.
        # Batches are right-padded, so the causal mask alone keeps every real token from seeing
        # padding (which only follows it): ``attention_mask`` is not passed on, and attention
        # takes SDPA's fused causal kernel instead of a materialised (B, 1, T, T) mask.
        # No key/value cache: it costs memory, and activation checkpointing would replay a
        # forward into the same cache object and double its length.
        del attention_mask
        hidden = self.model.base_model(
            input_ids=input_ids[:, :-1], use_cache=False
        ).last_hidden_state
        head = self.model.get_output_embeddings()
        return loss_outputs(*scored_row_nll(head, hidden, labels[:, 1:]))

    def save(self, directory: Path) -> None:
        """Write weights (safetensors), config and tokenizer in Hugging Face's layout."""
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


def scored_row_nll(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed cross-entropy over its scored targets, and how many it has.

    ``hidden`` ``(B, T, H)`` predicts ``targets`` ``(B, T)`` (``-100``: not scored). The
    vocabulary projection runs only where a token is scored, ``LOGIT_CHUNK_ROWS`` rows of logits at
    a time, each chunk recomputed in the backward pass instead of stored: fp32 logits of 16 × 1024
    GPT-2 tokens would be 3.3 GB.
    """
    scored = targets != IGNORE_INDEX
    hidden, flat_targets = hidden[scored], targets[scored]
    chunks = range(0, len(flat_targets), LOGIT_CHUNK_ROWS)
    recompute = len(flat_targets) > LOGIT_CHUNK_ROWS and torch.is_grad_enabled()
    projection = _aligned_projection(head)
    pieces = []
    for i in chunks:
        arguments = (
            projection,
            hidden[i : i + LOGIT_CHUNK_ROWS],
            flat_targets[i : i + LOGIT_CHUNK_ROWS],
        )
        if recompute:
            pieces.append(checkpoint(_chunk_nll, *arguments, use_reentrant=False))
        else:
            pieces.append(_chunk_nll(*arguments))
    token_nll = torch.cat(pieces)
    rows = scored.nonzero()[:, 0]
    row_nll = torch.zeros(len(targets), dtype=token_nll.dtype, device=token_nll.device)
    return row_nll.index_add(0, rows, token_nll), scored.sum(dim=1)


def loss_outputs(row_nll: torch.Tensor, num_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """``forward``'s outputs from each row's summed cross-entropy and scored-token count."""
    loss = (row_nll / num_tokens.clamp(min=1)).mean()
    return {"loss": loss, "loglikelihood": -row_nll, "num_tokens": num_tokens}


def _chunk_nll(
    projection: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(projection(hidden).float(), targets, reduction="none")


#: The vocabulary projection's output width is padded to a multiple of this: GPT-2's 50,257 rows
#: leave cuBLAS only slow unaligned GEMM kernels (measured: 3x slower on an H200).
VOCAB_ALIGNMENT = 64


def _aligned_projection(head: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``head`` as a function whose output is padded to ``VOCAB_ALIGNMENT`` columns.

    The extra columns have zero weights and a ``-inf`` bias, so they add nothing to any softmax:
    the cross-entropy over the padded logits equals the one over the real ones. Heads other than
    ``nn.Linear`` are used as they are.
    """
    if not isinstance(head, torch.nn.Linear):
        return head
    weight: torch.Tensor = head.weight
    bias: torch.Tensor | None = head.bias
    vocab = weight.shape[0]
    extra = -vocab % VOCAB_ALIGNMENT
    if extra == 0:
        return head
    weight = F.pad(weight, (0, 0, 0, extra))
    masked = torch.zeros(vocab + extra, dtype=weight.dtype, device=weight.device)
    masked[vocab:] = float("-inf")
    bias = masked if bias is None else F.pad(bias, (0, extra)) + masked
    return functools.partial(F.linear, weight=weight, bias=bias)


def _fuse_tanh_gelu(model: torch.nn.Module) -> None:
    """Compute GPT-2's ``gelu_new`` with torch's fused kernel (the same tanh formula).

    Hugging Face's ``NewGELUActivation`` evaluates it as five elementwise kernels (measured: a
    third of the GPU time of PIQA scoring); ``nn.GELU(approximate="tanh")`` is one, and agrees to
    within float rounding (4.8e-7 in fp32). The saved config still says ``gelu_new``.
    """
    for name, module in list(model.named_modules()):
        if isinstance(module, NewGELUActivation):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, torch.nn.GELU(approximate="tanh"))


def _build_model(model: str | None, config: dict[str, Any] | None, seed: int) -> PreTrainedModel:
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
        reason = " ".join(str(error).split())[:300]
        raise ConfigurationError(f"cannot build a model from 'config': {reason}") from None


def _load_tokenizer(source: str) -> Any:
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError) as error:
        raise ConfigurationError(_cannot_load("tokenizer", source, error)) from None


def _set_padding_token(tokenizer: Any, config: Any) -> None:
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
    reason = " ".join(str(error).split())[:300]
    return f"cannot load {what} from {where}: {reason}"
