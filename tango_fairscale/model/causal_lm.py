"""The Tango ``Model`` around a Hugging Face causal LM: one ``forward`` for the training loss and
for scoring choices, over right-padded or packed batches; checked when loaded, and hashed for
Tango's cache by how it was made and the fingerprint of its files (never by pickling it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tango.common.det_hash import CustomDetHash
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model

from .. import compat  # noqa: F401  (the fixes; transformers' before it is imported)
from ..compat.transformers import unpacked_sequences
from ..runtime.devices import to_device
from .decoding import next_token_logits
from .fingerprint import source_fingerprint
from .loading import (
    build_model,
    check_tokenizer,
    context_length,
    fuse_tanh_gelu,
    load_tokenizer,
    set_padding_token,
)
from .logits import check_fast_path, logit_transform
from .loss import loss_outputs, scored_row_nll
from .packing import (
    MASKED_ATTENTION,
    attention_window,
    packed_attention_mask,
    packing_matches_padding,
)

# Only for annotations: transformers' model code (~1 s to import) is imported by .loading when a
# model is loaded, not by every ``tango run``.
if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: Part of every model's cache key: bump it when what a ModelWrapper made from the same arguments
#: and files computes changes.
MODEL_VERSION = "001"


@Model.register("tango_fairscale::causal_lm")
class ModelWrapper(Model, CustomDetHash):
    """A Hugging Face causal LM with its tokenizer, scoring choices the way lm-eval does.

    Registered as a Tango ``Model`` under the name ``"tango_fairscale::causal_lm"``.

    :param model: a Hugging Face hub id or a local directory holding ``config.json`` and weights.
    :param config: build the model with random weights from this config instead of loading weights
        (merged over ``model``'s config when both are given; needs ``model_type`` otherwise).
    :param tokenizer: hub id or local directory of the tokenizer; defaults to ``model``.
    :param seed: seeds the random initialisation when ``config`` is given.

    ``forward(input_ids, attention_mask, labels)`` takes a right-padded batch from
    :func:`tango_fairscale.data.batches.collate` (``labels`` may stay on the CPU: the scored
    positions are then picked there, without waiting for the device) and returns

    * ``loglikelihood`` ``(B,)``, float64: the summed log-probability of each row's labelled
      tokens (their fp32 values summed in float64, so that a row's score does not depend on
      the batch it is in: :func:`~.loss.row_sums`);
    * ``num_tokens`` ``(B,)``: how many tokens each row scores;
    * ``loss``: the mean over rows of the per-token cross-entropy of each row — the same for any
      split of a batch into equal parts, so data-parallel ranks average to the global loss.

    With ``position_ids`` and ``query_ids`` it takes a packed batch from
    :func:`tango_fairscale.data.batches.packed_batch` instead (where :attr:`supports_packing`) and
    returns the same per query (``B`` = queries) as their right-padded rows would.

    With ``past_key_values`` (a cache from :func:`~.decoding.new_cache`) it decodes instead: the
    left-padded ``input_ids`` follow the cached tokens, ``attention_mask`` covers both, and it
    returns ``logits`` ``(B, V)``, the model's own next-token logits
    (:func:`~.decoding.next_token_logits`), the cache updated in place.

    Loading refuses, in one line, a model whose own forward computes other log-likelihoods than
    the scorer (:func:`~.logits.check_fast_path`), a tokenizer that does not encode text and an
    end-of-text id outside the tokenizer (the first at :meth:`probe`). The weights are fp32
    whatever the checkpoint stores, built on the CPU.

    Its Tango hash (a step's cache key) is :attr:`origin`: ``MODEL_VERSION``, the construction
    arguments and the fingerprints of the ``model`` and ``tokenizer`` sources
    (:func:`~.fingerprint.source_fingerprint`), taken before loading; not its weights, so code
    that changes them afterwards sets ``origin`` (the training step sets its own unique id).

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
        #: What the cache key of a step taking this model is made of (see the class docstring).
        self.origin: tuple[Any, ...] = model_origin(model, config, tokenizer, seed)
        tokenizer_source = tokenizer or model
        assert tokenizer_source is not None  # model_origin refuses neither
        self.model: PreTrainedModel = build_model(model, config, seed)
        fuse_tanh_gelu(self.model)
        #: What the model's own forward does to its head's output (the fast loss does the same).
        self.logit_transform = logit_transform(self.model.config)
        #: Parameters of the model (tied ones once), counted before any engine shards them.
        self.num_parameters = sum(parameter.numel() for parameter in self.model.parameters())
        #: Logged training metrics by step (set by the training step and the stored format).
        self.training_log: list[dict[str, Any]] = []
        self.tokenizer = load_tokenizer(tokenizer_source)
        check_tokenizer(self.tokenizer, tokenizer_source, self.model.config)
        set_padding_token(self.tokenizer, self.model.config)
        #: Whether packed queries score as padded ones do; ``None`` until :meth:`probe`.
        self._takes_packed_batches: bool | None = None

    def probe(self) -> None:
        """The load probes, once, where the model is now: refuse (one line) a model whose own
        forward computes other log-likelihoods than the scorer
        (:func:`~.logits.check_fast_path`), and find whether packed queries score as padded ones.

        Their forwards need the whole model: an engine probes it before it wraps (and shards)
        it, on the GPU where the whole fp32 model goes anyway (milliseconds there, ~1 s of CPU
        forwards at 124M); an evaluation's model is probed on its device as it is loaded; any
        other model at its first :attr:`supports_packing` (a trained model rebuilt from its
        weights, probed as it trained, goes unprobed until it is scored)."""
        if self._takes_packed_batches is not None:
            return
        vocab_size = int(self.model.config.get_text_config().vocab_size)
        check_fast_path(self.model, self.logit_transform, vocab_size)
        window = attention_window(self.model.config)
        self._takes_packed_batches = (
            self.model.config._attn_implementation in MASKED_ATTENTION
            and (window is None or window >= self.max_length)
            and packing_matches_padding(self, self.pad_token_id)
        )

    def det_hash_object(self) -> Any:
        return self.origin

    @property
    def max_length(self) -> int:
        """The longest input (:func:`~tango_fairscale.model.loading.context_length`)."""
        return context_length(self.model.config, self.tokenizer)

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def supports_packing(self) -> bool:
        """Whether the model takes packed batches: its attention takes explicit masks, no layer
        attends a window shorter than :attr:`max_length` (a packed batch's mask is the same for
        every layer, without the window) and, probed (:meth:`probe`, run here if it has not
        run), it scores packed queries as it scores them padded (Bloom does not: its ALiBi is
        built from a 2-D mask)."""
        if self.model.config._attn_implementation not in MASKED_ATTENTION:  # set after loading?
            return False
        self.probe()
        return bool(self._takes_packed_batches)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        query_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
    ) -> dict[str, torch.Tensor]:
        if past_key_values is not None:  # decoding: next-token logits, the cache updated in place
            assert position_ids is not None, "decoding needs position_ids"
            return next_token_logits(
                self.model, input_ids, attention_mask, position_ids, past_key_values
            )
        if labels is None:
            raise ValueError("forward needs labels (or past_key_values, to decode)")
        # No key/value cache: it costs memory, and activation checkpointing would replay a
        # forward into the same cache object and double its length.
        del attention_mask
        head = self.model.get_output_embeddings()
        if position_ids is None:
            # Right-padded rows: position t is predicted from positions < t, so the last token is
            # never an input, and the causal mask alone keeps every real token from seeing
            # padding (which only follows it): ``attention_mask`` is not passed on, and attention
            # takes SDPA's fused causal kernel instead of a materialised (B, 1, T, T) mask.
            with unpacked_sequences():  # no host read of a GPU tensor per forward
                hidden = self.model.base_model(
                    input_ids=input_ids[:, :-1], use_cache=False
                ).last_hidden_state
            return loss_outputs(
                *scored_row_nll(head, hidden, labels[:, 1:], transform=self.logit_transform)
            )
        if query_ids is None:
            raise ValueError("a packed batch (with position_ids) needs query_ids")
        # Packed rows are already shifted: input t predicts labels[:, t].
        hidden = self.packed_hidden(input_ids, position_ids, to_device(query_ids, input_ids.device))
        # query_ids stays on the CPU (move_batch): its largest value costs no device wait.
        num_queries = int(query_ids.max()) + 1
        return loss_outputs(
            *scored_row_nll(
                head, hidden, labels, query_ids, num_queries, transform=self.logit_transform
            )
        )

    def packed_hidden(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_ids: torch.Tensor
    ) -> torch.Tensor:
        """The base model's last hidden states of a packed batch (every tensor on the model's
        device), each token attending as :func:`packed_attention_mask` allows."""
        mask = packed_attention_mask(position_ids, query_ids)
        if self.model.config._attn_implementation == "eager":  # an additive mask there
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill_(
                ~mask, torch.finfo(torch.float32).min
            )
        return self.model.base_model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=False
        ).last_hidden_state

    def save(self, directory: Path) -> None:
        """Write weights (safetensors), config and tokenizer in Hugging Face's layout."""
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


def model_origin(
    model: str | None = None,
    config: dict[str, Any] | None = None,
    tokenizer: str | None = None,
    seed: int = 0,
) -> tuple[Any, ...]:
    """:attr:`ModelWrapper.origin` of the model these arguments make, without loading it:
    ``MODEL_VERSION``, the arguments and the fingerprints of the ``model`` and ``tokenizer``
    sources. Refuses, in one line, arguments that make no model."""
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
    if (tokenizer or model) is None:
        raise ConfigurationError("a model built from 'config' needs 'tokenizer' (hub id or dir)")
    return (
        "tango_fairscale::causal_lm",
        MODEL_VERSION,
        {"model": model, "config": config, "tokenizer": tokenizer, "seed": seed},
        *(source_fingerprint(s) if s is not None else None for s in (model, tokenizer)),
    )


def packing_refusal(model: ModelWrapper) -> str:
    """The one-line refusal of ``pack_sequences: true`` for a model that does not take packed
    batches (:attr:`ModelWrapper.supports_packing` is false)."""
    name = type(model.model).__name__
    attention = model.model.config._attn_implementation
    if attention not in MASKED_ATTENTION:
        problem = (
            f"pack_sequences needs an attention that takes masks ('sdpa' or 'eager'); {name} "
            f"uses {attention!r}"
        )
    elif (window := attention_window(model.model.config)) is not None and window < model.max_length:
        problem = (
            f"pack_sequences needs a model whose attention sees every earlier token; {name} "
            f"attends a window of {window} tokens in some layers"
        )
    else:
        problem = (
            f"pack_sequences needs a model that scores packed queries as padded ones; {name} "
            "does not (probed at load)"
        )
    return f"{problem}: set pack_sequences to null (packed where possible) or false"
