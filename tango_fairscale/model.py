"""The Tango ``Model`` around a Hugging Face causal LM: loading, training loss, choice scoring."""

from __future__ import annotations

import difflib
import functools
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.activations import NewGELUActivation
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from . import compat
from .batching import IGNORE_INDEX

logger = logging.getLogger(__name__)

#: Attention implementations that take the explicit (R, 1, T, T) masks of packed batches.
MASKED_ATTENTION = ("sdpa", "eager")

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
    :func:`tango_fairscale.batching.collate` (``labels`` may stay on the CPU: the scored positions
    are then picked there, without waiting for the device) and returns

    * ``loglikelihood`` ``(B,)``: the summed log-probability of each row's labelled tokens;
    * ``num_tokens`` ``(B,)``: how many tokens each row scores;
    * ``loss``: the mean over rows of the per-token cross-entropy of each row — the same for any
      split of a batch into equal parts, so data-parallel ranks average to the global loss.

    With ``position_ids`` and ``query_ids`` it takes a packed batch from
    :func:`tango_fairscale.batching.packed_batch` instead (where :attr:`supports_packing`) and
    returns the same per query (``B`` = queries) as their right-padded rows would.

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

    @property
    def supports_packing(self) -> bool:
        """Whether the model's attention takes the explicit masks of packed batches."""
        return self.model.config._attn_implementation in MASKED_ATTENTION

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        query_ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        # No key/value cache: it costs memory, and activation checkpointing would replay a
        # forward into the same cache object and double its length.
        del attention_mask
        head = self.model.get_output_embeddings()
        if position_ids is None:
            # Right-padded rows: position t is predicted from positions < t, so the last token is
            # never an input, and the causal mask alone keeps every real token from seeing
            # padding (which only follows it): ``attention_mask`` is not passed on, and attention
            # takes SDPA's fused causal kernel instead of a materialised (B, 1, T, T) mask.
            with compat.unpacked_sequences():  # no host read of a GPU tensor per forward
                hidden = self.model.base_model(
                    input_ids=input_ids[:, :-1], use_cache=False
                ).last_hidden_state
            return loss_outputs(*scored_row_nll(head, hidden, labels[:, 1:]))
        if query_ids is None:
            raise ValueError("a packed batch (with position_ids) needs query_ids")
        # Packed rows are already shifted: input t predicts labels[:, t].
        mask = packed_attention_mask(
            position_ids, query_ids.to(input_ids.device, non_blocking=True)
        )
        if self.model.config._attn_implementation == "eager":  # an additive mask there
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill_(
                ~mask, torch.finfo(torch.float32).min
            )
        hidden = self.model.base_model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=False
        ).last_hidden_state
        # query_ids stays on the CPU (move_batch): its largest value costs no device wait.
        num_queries = int(query_ids.max()) + 1
        return loss_outputs(*scored_row_nll(head, hidden, labels, query_ids, num_queries))

    def save(self, directory: Path) -> None:
        """Write weights (safetensors), config and tokenizer in Hugging Face's layout."""
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


#: Batch entries :func:`move_batch` leaves on the CPU.
HOST_INPUTS = ("labels", "query_ids")


def move_batch(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``batch`` on ``device``, except ``HOST_INPUTS``: left on the CPU, where
    :class:`ModelWrapper` picks the scored positions without waiting for the device (wrappers
    that move every input, such as multi-process DDP, still work, at one wait per forward)."""
    return {
        name: tensor if name in HOST_INPUTS else tensor.to(device, non_blocking=True)
        for name, tensor in batch.items()
    }


def packed_attention_mask(position_ids: torch.Tensor, query_ids: torch.Tensor) -> torch.Tensor:
    """``(R, 1, T, T)``, true where a token of a packed row may attend another (see
    :func:`~tango_fairscale.batching.packed_batch`): an earlier or the same token of its
    segment (a segment starts where the position is 0), shared (query -1) or of its own query."""
    segment = (position_ids == 0).cumsum(dim=1)
    same_segment = segment[:, :, None] == segment[:, None, :]
    visible = (query_ids[:, None, :] == -1) | (query_ids[:, :, None] == query_ids[:, None, :])
    width = position_ids.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=position_ids.device).tril()
    return (same_segment & visible & causal)[:, None]


def scored_row_nll(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    groups: torch.Tensor | None = None,
    num_groups: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's mean and summed cross-entropy over its scored targets, and how many it has.

    ``hidden`` ``(B, T, H)`` predicts ``targets`` ``(B, T)`` (``-100``: not scored). Returns
    ``(row_mean_nll, row_nll, num_tokens)``, each ``(B,)``; a row without scored targets has mean
    0. Only ``row_mean_nll`` carries gradients, and only for a loss that weighs every row alike
    (a multiple of ``row_mean_nll.sum()``, such as :func:`loss_outputs`' mean). With ``groups``
    ``(B, T)`` (packed rows), the "rows" are instead the ``num_groups`` values it holds at the
    scored positions.

    The vocabulary projection runs only where a token is scored, ``LOGIT_CHUNK_ROWS`` rows of
    logits at a time, and (see :class:`_ScoredCrossEntropy`) its gradients are computed with the
    forward, so that neither all logits (fp32 logits of 16 × 1024 GPT-2 tokens: 3.3 GB) nor a
    second projection in the backward pass are needed.
    """
    # Labels left on the CPU (as the scoring step leaves them) make picking the scored positions
    # free; on the device it waits for the device once (the count of positions sets the shapes).
    device = hidden.device
    scored = targets != IGNORE_INDEX
    positions = scored.flatten().nonzero()[:, 0]
    if groups is None:
        num_tokens = scored.sum(dim=1)
        rows = positions // targets.shape[1]
    else:
        assert num_groups is not None
        rows = groups.flatten()[positions.to(groups.device)].to(positions.device)
        num_tokens = torch.bincount(rows, minlength=num_groups)
    token_weights = (1.0 / num_tokens.clamp(min=1).float())[rows]
    weight, bias = _aligned_projection(head)
    row_mean_nll, row_nll = _ScoredCrossEntropy.apply(
        hidden.flatten(0, 1).index_select(0, positions.to(device, non_blocking=True)),
        weight,
        bias,
        targets.flatten()[positions].to(device, non_blocking=True),
        token_weights.to(device, non_blocking=True),
        rows.to(device, non_blocking=True),
        len(num_tokens),
    )
    return row_mean_nll, row_nll, num_tokens.to(device, non_blocking=True)


def loss_outputs(
    row_mean_nll: torch.Tensor, row_nll: torch.Tensor, num_tokens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``forward``'s outputs from :func:`scored_row_nll`'s."""
    return {"loss": row_mean_nll.mean(), "loglikelihood": -row_nll, "num_tokens": num_tokens}


class _ScoredCrossEntropy(torch.autograd.Function):
    """Token cross-entropies of ``hidden @ weight.T + bias`` against ``targets``, chunk by chunk,
    summed per row: weighted by ``token_weights`` (differentiable) and plain (not).

    When gradients are needed, the forward computes them from each chunk's softmax at once
    (``d nll / d logits = softmax - onehot``) and keeps only the ``(N, H)`` and ``(V, H)``
    results; the backward scales them by the incoming gradient. That is exact when every row
    receives the same gradient, which the backward checks. Gradient matrix products run in the
    compute dtype (the autocast dtype, else the inputs'), in fp32 instead of fp16: the
    unscaled gradients would underflow there.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        token_weights: torch.Tensor,
        rows: torch.Tensor,
        num_rows: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        device_type = hidden.device.type
        dtype = (
            torch.get_autocast_dtype(device_type)
            if torch.is_autocast_enabled(device_type)
            else hidden.dtype
        )
        grad_dtype = torch.float32 if dtype == torch.float16 else dtype
        n, width = hidden.shape
        vocab = weight.shape[0]
        token_nll = torch.empty(n, dtype=torch.float32, device=hidden.device)
        grad_hidden = hidden.new_empty(n, width, dtype=torch.float32) if need_hidden else None
        grad_weight = weight.new_zeros(vocab, width, dtype=torch.float32) if need_weight else None
        grad_bias = weight.new_zeros(vocab, dtype=torch.float32) if need_bias else None
        # Compiled on GPUs when training (memory-bound passes over the logits fused into a few
        # kernels: eager, they cost ~10 % of a 124M step on an H200); scoring stays eager, where
        # a compilation per process would cost more than it saves.
        need_grads = need_hidden or need_weight or need_bias
        chunk_cross_entropy = (
            _compiled_chunk_cross_entropy()
            if need_grads and device_type == "cuda"
            else _chunk_cross_entropy
        )
        # Scoring on a GPU in low precision: the GEMM writes fp32 logits itself.
        float_logits = not need_grads and device_type == "cuda" and dtype != torch.float32
        with torch.autocast(device_type, enabled=False):
            compute_weight = weight.to(dtype)
            compute_bias = None if bias is None else bias.to(dtype)
            # The compute-dtype copy serves the gradient products too, unless those run in fp32.
            projection = compute_weight if grad_dtype == dtype else weight.to(grad_dtype)
            for start in range(0, n, LOGIT_CHUNK_ROWS):
                end = min(start + LOGIT_CHUNK_ROWS, n)
                chunk = hidden[start:end].to(dtype)
                token_nll[start:end], grad_logits, chunk_grad_bias = chunk_cross_entropy(
                    _project(chunk, compute_weight, compute_bias, float_logits),
                    targets[start:end],
                    token_weights[start:end] if need_grads else None,
                    grad_dtype,
                    need_bias,
                )
                if grad_logits is None:  # scoring only
                    continue
                if grad_bias is not None and chunk_grad_bias is not None:
                    grad_bias += chunk_grad_bias
                if grad_hidden is not None:
                    grad_hidden[start:end] = grad_logits @ projection
                if grad_weight is not None:
                    grad_weight += grad_logits.T @ chunk.to(grad_dtype)
        ctx.grads = (grad_hidden, grad_weight, grad_bias)
        ctx.rows = rows
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        zeros = token_nll.new_zeros(num_rows)
        row_nll = zeros.index_add(0, rows, token_nll)
        ctx.mark_non_differentiable(row_nll)
        return zeros.index_add(0, rows, token_nll * token_weights), row_nll

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_row_mean: torch.Tensor, _grad_row_nll: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias = ctx.grads
        hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
        grad_row_mean = grad_row_mean.float()
        # Weight gradients were summed over rows in the forward: only a common factor applies.
        torch._assert_async(
            (grad_row_mean == grad_row_mean[0]).all(),
            "_ScoredCrossEntropy: rows must receive equal gradients (a loss over their mean)",
        )
        common = grad_row_mean[0]
        return (
            None
            if grad_hidden is None
            else (grad_hidden * grad_row_mean[ctx.rows, None]).to(hidden_dtype),
            None if grad_weight is None else (grad_weight * common).to(weight_dtype),
            None if grad_bias is None else (grad_bias * common).to(bias_dtype),
            None,
            None,
            None,
            None,
        )


def _project(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, float_output: bool
) -> torch.Tensor:
    """``hidden @ weight.T + bias``; with ``float_output`` (CUDA) written in fp32 by the GEMM
    itself, which saves a pass over the logits converting them."""
    if not float_output:
        return F.linear(hidden, weight, bias)
    if bias is None:
        return torch.mm(hidden, weight.T, out_dtype=torch.float32)
    return torch.addmm(bias.float(), hidden, weight.T, out_dtype=torch.float32)


def _chunk_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    token_weights: torch.Tensor | None,
    grad_dtype: torch.dtype,
    need_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Cross-entropy of each row of ``logits`` ``(N, V)`` against ``targets`` ``(N,)``, in fp32.

    With ``token_weights`` ``(N,)`` also ``d sum(token_weights * nll) / d logits`` (``grad_dtype``)
    and, if ``need_bias``, its fp32 sum over rows; else those are ``None``.
    """
    logits = logits.float()
    if token_weights is None:
        # One fused log-softmax pass (logsumexp alone makes four passes over the logits).
        return F.cross_entropy(logits, targets, reduction="none"), None, None
    targets = targets[:, None]
    log_normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)
    nll = (log_normalizer - logits.gather(1, targets))[:, 0]
    # d (weight_t * nll_t) / d logits_t = weight_t * (softmax_t - onehot_t), computed in place.
    grad_logits = logits.sub_(log_normalizer).exp_()
    grad_logits.scatter_add_(1, targets, grad_logits.new_full(targets.shape, -1.0))
    grad_logits.mul_(token_weights[:, None])
    grad_bias = grad_logits.sum(dim=0) if need_bias else None
    return nll, grad_logits.to(grad_dtype), grad_bias


@functools.cache
def _compiled_chunk_cross_entropy() -> Any:
    """:func:`_chunk_cross_entropy` under ``torch.compile`` (``TORCH_COMPILE_DISABLE=1``: eager)."""
    return torch.compile(_chunk_cross_entropy)


#: The vocabulary projection's output width is padded to a multiple of this: GPT-2's 50,257 rows
#: leave cuBLAS only slow unaligned GEMM kernels (measured: 3x slower on an H200).
VOCAB_ALIGNMENT = 64


def _aligned_projection(head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linear ``head``'s weight and bias, the output padded to ``VOCAB_ALIGNMENT`` columns.

    The extra rows of the weight are zeros and their bias is ``-inf``, so they add nothing to any
    softmax: the cross-entropy over the padded logits equals the one over the real ones.
    """
    weight = head.weight
    bias = getattr(head, "bias", None)
    assert isinstance(weight, torch.Tensor)
    vocab = weight.shape[0]
    extra = -vocab % VOCAB_ALIGNMENT
    if extra == 0:
        return weight, bias
    weight = F.pad(weight, (0, 0, 0, extra))
    masked = torch.zeros(vocab + extra, dtype=weight.dtype, device=weight.device)
    masked[vocab:] = float("-inf")
    return weight, masked if bias is None else F.pad(bias, (0, extra)) + masked


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
